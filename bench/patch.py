"""Patches cut by the library (`patch=`) against whole fields cropped afterwards by
`insitubatch.augment.RandomCrop` (a batch transform) and against whole fields not cropped at
all, in one process, on the same store (docs/benchmarks.md, "Patches").

    cargo build --release
    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \\
        python3 bench/patch.py /tmp/patch [--rounds 5]

Builds (once) ERA5-like stores of two variables, 512 samples of 181 x 360 float32, zstd-3, at 1
and 16 samples per chunk. Each round runs, alternated, one dataset per setting for `--epochs`
epochs and keeps its best epoch after the first: resident epochs (a budget holding the split,
every chunk a hit: the copy is all there is) and cold ones (the default budget at one sample
per chunk, every chunk decoded). Both variables are cropped, at one origin per row.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import insitubatch as isb
from insitubatch.augment import RandomCrop

SIZE = (64, 64)


def make_store(root: Path, spc: int) -> Path:
    store = root / f"era5_spc{spc}.zarr"
    if not store.exists():
        exe = Path(__file__).resolve().parent.parent / "target/release/insitubatch"
        subprocess.run(
            [str(exe), "make-dataset", str(store), "--samples", "512", "--sample-chunk", str(spc)],
            check=True, stdout=subprocess.DEVNULL,
        )
    for f in store.rglob("*"):  # page cache warm
        if f.is_file():
            f.read_bytes()
    return store


SETTINGS = {
    # name: dataset arguments
    "patch= (in the library)": {"patch": SIZE},
    "RandomCrop (batch transform)": {"batch_transforms": [RandomCrop(SIZE, seed=1)]},
    "whole fields, not cropped": {},
}


def epoch_rates(ds: isb.InSituDataset, epochs: int, field: tuple) -> list[float]:
    """Samples/s of each epoch, each batch's t2m checked to be `field` shaped."""
    rates = []
    for e in range(epochs):
        ds.set_epoch(e)
        n, t0 = 0, time.perf_counter()
        for b in ds.train:
            assert b.arrays["t2m"].shape[1:] == field
            n += len(b)
        rates.append(n / (time.perf_counter() - t0))
    return rates


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    # A budget over the split (2 variables x 512 samples x 260 KB = 267 MB) keeps every chunk.
    cases = [("resident", 16, 1 << 30), ("cold", 1, None)]
    print("| epochs | samples/chunk | setting | best later epoch samples/s | vs patch= "
          "| epoch 0 samples/s | batch bytes |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for kind, spc, budget in cases:
        store = make_store(args.root, spc)
        best: dict[str, float] = {}
        first: dict[str, float] = {}
        batch_bytes: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, kwargs in SETTINGS.items():
                with isb.InSituDataset(store, cache_budget_bytes=budget, **kwargs) as ds:
                    field = (181, 360) if name.startswith("whole") else SIZE
                    rates = epoch_rates(ds, args.epochs, field)
                    if budget is not None:  # epochs after the first are all hits
                        assert ds.stats()["cache_misses"] == 0, ds.stats()
                    batch_bytes[name] = ds.memory_need()["batch_bytes"]
                best[name] = max(best.get(name, 0.0), max(rates[1:]))
                first[name] = max(first.get(name, 0.0), rates[0])
        base = best["patch= (in the library)"]
        for name, rate in best.items():
            print(f"| {kind} | {spc} | {name} | {rate:.0f} | {rate / base:.2f} "
                  f"| {first[name]:.0f} | {batch_bytes[name]:,} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
