"""What fitting statistics costs: `ds.statistics(split)` (the library's f64 accumulation over an
epoch) against iterating the same epoch and touching nothing, and against numpy's own
reduction of each batch (`float64` sum and sum of squares per batch, what a user loop would
do), in one process, alternated, best of `--rounds`.

    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \\
        python3 bench/statistics.py /tmp/insitubatch-harness/era5_spc8_512_181x360.zarr
"""

import argparse
import time

import numpy as np

import insitubatch as isb


def epoch(ds):
    n = 0
    for b in ds.train:
        n += len(b)
    return n


def numpy_loop(ds):
    n, acc = 0, {}
    for b in ds.train:
        n += len(b)
        for name, a in b.arrays.items():
            x = a.astype(np.float64)
            s = acc.setdefault(name, [0, 0.0, 0.0])
            s[0] += x.size
            s[1] += x.sum()
            s[2] += np.square(x).sum()
    return n


def statistics(ds):
    st = ds.statistics("train")
    return next(iter(st.values())).count // int(np.prod(ds.geometries[next(iter(st))].inner_shape))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    # A budget holding the split: every epoch after the first is all hits, so what differs
    # between the rows is the consumer's work, not the decode.
    with isb.InSituDataset(a.store, cache_budget_bytes=8 << 30) as ds:
        epoch(ds)  # fill the pool
        best = {}
        for _ in range(a.rounds):
            for name, f in (("iterate only", epoch), ("numpy per batch", numpy_loop),
                            ("ds.statistics", statistics)):
                t = time.perf_counter()
                n = f(ds)
                dt = time.perf_counter() - t
                best[name] = min(best.get(name, dt), dt)
                print(f"{name:>16}: {n / dt:9.0f} samples/s", flush=True)
        base = best["iterate only"]
        print("\nbest of", a.rounds)
        for name, dt in best.items():
            print(f"{name:>16}: {n / dt:9.0f} samples/s  {base / dt:.2f}x iterate only")


if __name__ == "__main__":
    main()
