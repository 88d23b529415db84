"""Per-batch overhead of the Python shim against the Rust API on tiny batches, and proof of zero
copy on large ones. Usage: python bench/python_overhead.py [DIR]   (after `cargo build --release`;
run with PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import insitubatch as isb

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release" / "insitubatch"
DIR = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/insitubatch-bench")
EPOCHS, BS = 6, 8


def make(name, *args):
    store = DIR / name
    if not (store / "zarr.json").exists():
        subprocess.run([BIN, "make-dataset", store, "--force", *args], check=True, capture_output=True)
    return store


tiny = make("tiny.zarr", "--samples", "16384", "--grid", "2x2", "--sample-chunk", "64",
            "--codec", "none", "--variables", "x")
# Rust: resident epochs (the budget holds the split), per-batch wall time as the consumer sees it.
out = subprocess.run([BIN, "bench", tiny, "--epochs", str(EPOCHS), "--batch-size", str(BS),
                      "--cache-budget-bytes", "split", "--json"], check=True, capture_output=True)
rust = json.loads(out.stdout)["epochs"][1:]
rust_us = min(e["seconds"] / e["stats"]["batches"] for e in rust) * 1e6

with isb.InSituDataset(tiny, batch_size=BS, cache_budget_bytes=1 << 30) as ds:
    best = float("inf")
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        t = time.perf_counter()
        n = sum(1 for _ in ds.train)
        if epoch > 0:
            best = min(best, (time.perf_counter() - t) / n)
py_us = best * 1e6
print(f"tiny batches ({BS} x 2x2 float32), resident: Rust {rust_us:.1f} us/batch, "
      f"Python {py_us:.1f} us/batch, shim overhead {py_us - rust_us:.1f} us/batch")

big = make("era5_spc8.zarr", "--samples", "512", "--sample-chunk", "8")
with isb.InSituDataset(big, batch_size=32) as ds:
    b = next(iter(ds.train))
    a = b.arrays["t2m"]
    same = not a.flags.owndata
    try:
        import torch

        same = same and torch.from_dlpack(a).data_ptr() == a.__array_interface__["data"][0]
    except ImportError:
        pass
    print(f"large batch {a.shape} {a.dtype}: numpy aliases the Rust buffer and torch shares its "
          f"pointer: {same}")
