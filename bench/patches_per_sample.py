"""Several patches per sample (`patches_per_sample=`) and a grid tiling every field
(`patch_grid=`), in one process, on the same stores (docs/benchmarks.md, "Several patches per
sample, and grids").

    cargo build --release
    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \\
        python3 bench/patches_per_sample.py /tmp/patch [--rounds 5]

Builds (once) ERA5-like stores of two variables, 512 samples of 181 x 360 float32, zstd-3, at 1
and 4 samples per chunk (`bench/patch.py` builds the same). Each round runs, alternated, one
dataset per setting for `--epochs` epochs with the default budget, and keeps each setting's
best first epoch (every chunk decoded) and best later epoch.

- Drawn patches: 64 x 64 patches, 1, 4 and 16 per sample. A chunk is read and decoded once
  for all of its samples' patches, so rows/s should grow with the count while the decode
  stays the same; the ratio is against one patch per sample.
- A grid: every field tiled by 64 x 64 patches (3 x 6 = 18 per sample, the last row and column
  moved back to the field's edge), against the baseline of reading whole fields and cutting
  the same 18 tiles of each with numpy (one `np.stack` of views per batch and variable, what a
  script does without `patch_grid`), in tiles/s; and the grid read in order, as inference
  reads it, with every tile put back into its field by `insitubatch.tiling.Stitcher` (the
  identity as the model), both variables.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import insitubatch as isb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from patch import make_store  # noqa: E402  (the same stores as bench/patch.py)

from insitubatch.tiling import Stitcher  # noqa: E402

SIZE = (64, 64)
FIELD = (181, 360)


def grid_origins() -> list[tuple[int, int]]:
    """The origins `patch_grid=True` places over the field, computed here with numpy."""
    axes = [np.minimum(np.arange(0, n - p + s, s), n - p) for n, p, s in zip(FIELD, SIZE, SIZE)]
    axes = [np.unique(a) for a in axes]
    return [(int(i), int(j)) for i in axes[0] for j in axes[1]]


def rows_per_s(ds: isb.InSituDataset, epochs: int, tile=None, stitch=False) -> list[float]:
    """Rows (tiles) per second of each epoch; with `tile`, whole fields cut into tiles; with
    `stitch`, both variables' tiles put back into whole fields by a `Stitcher` each."""
    rates = []
    for e in range(epochs):
        ds.set_epoch(e)
        stitchers = {name: Stitcher(ds) for name in ("t2m", "u10")} if stitch else {}
        n, fields, t0 = 0, 0, time.perf_counter()
        for b in ds.train:
            if tile is None:
                assert b.arrays["t2m"].shape[1:] == SIZE
                n += len(b)
                for name, stitcher in stitchers.items():
                    fields += len(stitcher.add(b, b.arrays[name]))
            else:
                for name in ("t2m", "u10"):
                    tiles = tile(b.arrays[name])
                n += len(tiles)
        rates.append(n / (time.perf_counter() - t0))
        for stitcher in stitchers.values():
            stitcher.close()
        assert fields == 2 * 512 * stitch
    return rates


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    origins = grid_origins()
    assert len(origins) == 18

    def numpy_tiles(x: np.ndarray) -> np.ndarray:
        return np.stack([x[:, i:i + SIZE[0], j:j + SIZE[1]] for i, j in origins], axis=1)\
            .reshape(-1, *SIZE)

    settings = {
        "1 patch per sample": ({"patch": SIZE}, None),
        "4 patches per sample": ({"patch": SIZE, "patches_per_sample": 4}, None),
        "16 patches per sample": ({"patch": SIZE, "patches_per_sample": 16}, None),
        "patch_grid=True (18 tiles)": ({"patch": SIZE, "patch_grid": True}, None),
        "patch_grid=True in order, stitched back (Stitcher)":
            ({"patch": SIZE, "patch_grid": True, "shuffle": False}, "stitch"),
        "whole fields, tiled with numpy": ({}, numpy_tiles),
    }
    print("| samples/chunk | setting | epoch 0 rows/s | vs 1 patch | best later epoch rows/s "
          "| vs 1 patch | rows per epoch |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for spc in (1, 4):
        store = make_store(args.root, spc)
        first: dict[str, float] = {}
        later: dict[str, float] = {}
        rows: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, (kwargs, tile) in settings.items():
                with isb.InSituDataset(store, **kwargs) as ds:
                    if tile == "stitch":
                        rates = rows_per_s(ds, args.epochs, stitch=True)
                    else:
                        rates = rows_per_s(ds, args.epochs, tile)
                    rows[name] = 512 * ds.patches_per_sample if ds.patch else 512 * 18
                first[name] = max(first.get(name, 0.0), rates[0])
                later[name] = max(later.get(name, 0.0), max(rates[1:]))
        b0, b1 = first["1 patch per sample"], later["1 patch per sample"]
        for name in settings:
            print(f"| {spc} | {name} | {first[name]:,.0f} | {first[name] / b0:.1f} "
                  f"| {later[name]:,.0f} | {later[name] / b1:.1f} | {rows[name]:,} |")
        g, w = "patch_grid=True (18 tiles)", "whole fields, tiled with numpy"
        print(f"\ngrid against numpy tiling at {spc} samples/chunk: epoch 0 "
              f"{first[g] / first[w]:.2f}x, later epochs {later[g] / later[w]:.2f}x\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
