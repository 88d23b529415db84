"""Variables as channels: `stacks=` (the library writes each label into its channel) against
`Batch.stack` (a copy of every batch after it arrives) and against the labels' own arrays left
unstacked, in one process, on the same store (docs/benchmarks.md, "Variables stacked as
channels").

    cargo build --release
    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \\
        python3 bench/stacks.py /tmp/stacks [--rounds 5]

Builds (once) ERA5-like stores of four variables, 512 samples of 181 x 360 float32, zstd-3,
at 1 and 16 samples per chunk. Each round runs, alternated, one process-warm dataset per setting
and keeps its best epoch after the first; resident epochs (a budget holding the split, every
chunk a hit) are where a copy per batch shows most, cold epochs (the default budget at one
sample per chunk, every chunk decoded) where it hides behind the decoders.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import insitubatch as isb

VARIABLES = ["t2m", "u10", "v10", "msl"]


def make_store(root: Path, spc: int) -> Path:
    store = root / f"era5x4_spc{spc}.zarr"
    if not store.exists():
        exe = Path(__file__).resolve().parent.parent / "target/release/insitubatch"
        subprocess.run(
            [str(exe), "make-dataset", str(store), "--samples", "512", "--sample-chunk", str(spc),
             "--variables", ",".join(VARIABLES)],
            check=True, stdout=subprocess.DEVNULL,
        )
    for f in store.rglob("*"):  # page cache warm
        if f.is_file():
            f.read_bytes()
    return store


def epoch_rates(ds: isb.InSituDataset, consume, epochs: int) -> list[float]:
    """Samples/s of each epoch, `consume(batch)` run on every batch."""
    rates = []
    for e in range(epochs):
        ds.set_epoch(e)
        n, t0 = 0, time.perf_counter()
        for b in ds.train:
            out = consume(b)
            n += out.shape[0]
        rates.append(n / (time.perf_counter() - t0))
    return rates


SETTINGS = {
    # name: (stacks argument, what the training loop does with each batch)
    "stacks= (in place)": ({"x": VARIABLES}, lambda b: b.arrays["x"]),
    "Batch.stack (copy)": (None, lambda b: b.stack(VARIABLES)),
    "own arrays, unstacked": (None, lambda b: b.arrays["t2m"]),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    # A budget over the split (4 variables x 512 samples x 260 KB = 533 MB) keeps every chunk.
    cases = [("resident", 16, 1 << 30), ("cold", 1, None)]
    print(f"{'epochs':8} {'spc':>3}  {'setting':24} {'best samples/s':>14}  {'vs stacks=':>10}")
    for kind, spc, budget in cases:
        store = make_store(args.root, spc)
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, (stacks, consume) in SETTINGS.items():
                with isb.InSituDataset(store, stacks=stacks, cache_budget_bytes=budget) as ds:
                    rates = epoch_rates(ds, consume, args.epochs)
                    if budget is not None:  # epochs after the first are all hits
                        assert ds.stats()["cache_misses"] == 0, ds.stats()
                best[name] = max(best.get(name, 0.0), max(rates[1:]))
        base = best["stacks= (in place)"]
        for name, rate in best.items():
            print(f"{kind:8} {spc:>3}  {name:24} {rate:14.0f}  {rate / base:10.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
