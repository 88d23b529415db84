"""Patches of a field stored in many chunks: insitubatch's `patch=` against a torch DataLoader
whose map-style Dataset reads each sample's window with zarr-python (`arr[i, i0:i0 + 64,
j0:j0 + 64]`, which reads only the stored chunks the window touches, as insitubatch does), in
one run, on the same stores (docs/benchmarks.md, "Patches").

    cargo build --release
    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \\
        python3 bench/patch_vs_dataloader.py /tmp/fat [--rounds 3]

The stores are the ones of "A patch of a field stored in many chunks" (made here when absent):
128 samples of a 720 x 1440 float32 field, one sample per chunk, 90 x 180 chunks or shards of
them; page cache warm. DataLoader: shuffled, batches of 32, `num_workers` 0, 2 and 4
(forkserver, persistent), the best later epoch of each is kept and the best of those is "tuned".
"""

import argparse
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import insitubatch as isb

SIZE = 64
EXE = Path(__file__).resolve().parent.parent / "target/release/insitubatch"


def make_store(root: Path, name: str, extra: list[str]) -> Path:
    store = root / f"{name}.zarr"
    if not store.exists():
        subprocess.run([str(EXE), "make-dataset", str(store), "--samples", "128", "--grid",
                        "720x1440", "--sample-chunk", "1", "--inner-chunks", "90x180",
                        "--variables", "t2m", *extra], check=True, stdout=subprocess.DEVNULL)
    for f in store.rglob("*"):  # page cache warm
        if f.is_file():
            f.read_bytes()
    return store


class WindowPerSample:
    """One sample's 64 x 64 window per __getitem__, read with zarr-python at an origin drawn
    from (epoch, index); module level so forkserver workers can unpickle it."""

    def __init__(self, store, n):
        self.store, self.n, self.epoch, self.array = str(store), n, 0, None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        import zarr

        if self.array is None:  # opened in the worker
            self.array = zarr.open_array(self.store + "/t2m", mode="r")
        rng = np.random.default_rng((self.epoch, i))
        i0 = int(rng.integers(0, self.array.shape[1] - SIZE + 1))
        j0 = int(rng.integers(0, self.array.shape[2] - SIZE + 1))
        return torch.from_numpy(np.asarray(self.array[i, i0:i0 + SIZE, j0:j0 + SIZE]))


def dataloader_rate(store: Path, workers: int, epochs: int) -> float:
    import torch

    data = WindowPerSample(store, 128)
    kwargs = {}
    if workers:
        kwargs = {"multiprocessing_context": "forkserver", "persistent_workers": True}
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True, num_workers=workers,
                                         **kwargs)
    rates = []
    for e in range(epochs):
        data.epoch = e  # seen by the main process only; workers draw from their copy's epoch
        n, t0 = 0, time.perf_counter()
        for batch in loader:
            assert batch.shape[1:] == (SIZE, SIZE)
            n += batch.shape[0]
        rates.append(n / (time.perf_counter() - t0))
    return max(rates[1:])


def insitubatch_rate(store: Path, epochs: int) -> float:
    rates = []
    with isb.InSituDataset(store, patch=(SIZE, SIZE)) as ds:
        for e in range(epochs):
            ds.set_epoch(e)
            n, t0 = 0, time.perf_counter()
            for b in ds.train:
                assert b.arrays["t2m"].shape[1:] == (SIZE, SIZE)
                n += len(b)
            rates.append(n / (time.perf_counter() - t0))
    return max(rates[1:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root", type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    stores = {"tiles": make_store(args.root, "tiles", []),
              "shards": make_store(args.root, "shards", ["--shard-samples", "1"])}
    print("| store | engine | best later epoch samples/s (per round) | × tuned DataLoader |")
    print("|---|---|---|---:|")
    for name, store in stores.items():
        rates: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            rates.setdefault("insitubatch patch=(64, 64)", []).append(
                insitubatch_rate(store, args.epochs))
            for w in (0, 2, 4):
                rates.setdefault(f"DataLoader, {w} workers", []).append(
                    dataloader_rate(store, w, args.epochs))
        tuned = max(max(v) for k, v in rates.items() if k.startswith("DataLoader"))
        for engine, rs in rates.items():
            per = " / ".join(f"{r:,.0f}" for r in rs)
            print(f"| {name} | {engine} | {per} | {max(rs) / tuned:.1f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    multiprocessing.set_start_method("forkserver")
    main()
