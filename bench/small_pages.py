"""Small pages against transparent huge pages for the allocator's arenas: a fresh process's first
epoch, its first batch, its later (resident) epochs and its peak RSS.

    cargo build --release
    python3 bench/small_pages.py /tmp/insitubatch-bench --rounds 5

For each store of the family (ERA5-like, 512 samples, 1 to 32 samples per chunk; made when
missing) and for the default blocks and `fast_first_batch`: `insitubatch bench --epochs 3
--json` in a fresh process, with the library's default (mimalloc advises no huge pages) and with
`MIMALLOC_ALLOW_THP=1` (mimalloc's own default: every arena advised `MADV_HUGEPAGE`), the two
alternated, each run after `--settle` s of idle as in the harness. Medians over the rounds.
"""

import os
import statistics

from fast_first_batch import FAMILY, SETTINGS, family_args, run_bench, store

PAGES = (("small pages (default)", {}), ("huge pages advised", {"MIMALLOC_ALLOW_THP": "1"}))


def main() -> None:
    a = family_args(__doc__.split("\n")[0]).parse_args()
    a.root.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k != "MIMALLOC_ALLOW_THP"}
    print("| samples/chunk | blocks | pages | epoch 0 samples/s | first batch ms (iterator) "
          "| best later epoch samples/s | peak RSS MiB |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for spc in FAMILY:
        path = store(a.bin, a.root / f"era5_spc{spc}.zarr", spc, 512)
        for blocks, flags in SETTINGS:
            runs = {name: [] for name, _ in PAGES}
            for _ in range(a.rounds):
                for name, extra in PAGES:
                    runs[name].append(run_bench(a.bin, path, flags, a.settle, {**base, **extra}))
            for name, _ in PAGES:
                r = runs[name]
                med = {k: statistics.median(x[k] for x in r) for k in r[0]}
                print(f"| {spc} | {blocks} | {name} | {med['epoch0']:.0f} | {med['ttfb_ms']:.1f} "
                      f"| {med['steady']:.0f} | {med['rss_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
