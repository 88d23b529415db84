"""What resuming an epoch at a batch costs against running it whole (docs/benchmarks.md,
"Resuming an epoch"). For each store, in one process, page cache warm, every pass on a fresh
dataset (an empty pool): an epoch resumed at 0, 1/4, 1/2 and 3/4 of its batches and at its
last, with the time to its first batch, the time to its end and the stored chunks it read.
Median of `--repeat`, the starts interleaved.

    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \\
        python3 bench/resume.py /tmp/insitubatch-bench/era5_spc{1,8,32}.zarr
"""

import argparse
import statistics
import time

import insitubatch as isb


def resumed(store, start):
    """(ms to the first batch, ms to the end, chunks read, samples) of one resumed pass, from
    its iterator's creation, on a fresh dataset (an empty pool)."""
    with isb.InSituDataset(store) as ds:
        t0 = time.perf_counter()
        first = None
        samples = 0
        for b in ds.train.from_batch(start):
            if first is None:
                first = time.perf_counter() - t0
            samples += len(b.sample_indices)
        end = time.perf_counter() - t0
        return 1e3 * (first or end), 1e3 * end, ds.stats()["tiles_read"], samples


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print("| store | resumed at batch | samples | chunks read | first batch ms | pass ms | pass / whole epoch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for store in args.stores:
        with isb.InSituDataset(store) as ds:
            n = len(ds.train)
            for _ in ds.train:  # page cache and allocator warm
                pass
        starts = sorted({0, n // 4, n // 2, 3 * n // 4, n - 1})
        # Interleaved, so that drift on a shared machine touches every start alike.
        runs = {k: [] for k in starts}
        for _ in range(args.repeat):
            for k in starts:
                runs[k].append(resumed(store, k))
        whole = statistics.median(r[1] for r in runs[0])
        for k in starts:
            first = statistics.median(r[0] for r in runs[k])
            end = statistics.median(r[1] for r in runs[k])
            _, _, chunks, samples = runs[k][0]
            name = store.rstrip("/").split("/")[-1]
            print(f"| {name} | {k} of {n} | {samples} | {chunks} | {first:.1f} | {end:.1f} | {end / whole:.2f} |")


if __name__ == "__main__":
    main()
