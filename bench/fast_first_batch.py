"""`fast_first_batch` against the default blocks: what a shuffled epoch's first batch costs, and
what the ramp costs in mixing.

    cargo build --release
    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \
        python3 bench/fast_first_batch.py /tmp/insitubatch-bench --rounds 5

Timing: for each store of the family (ERA5-like, 512 samples, 1 to 32 samples per chunk; made
with `insitubatch make-dataset` when missing), `insitubatch bench --epochs 3 --json` in a fresh
process, the two settings alternated, each run after 3 s of idle as in the harness. Reported:
medians over the rounds of the first batch from the iterator and from process start, epoch 0's
samples/s, the best later epoch, and peak RSS.

Mixing (no timing, through the Python shim): for each samples-per-chunk, on a store of 8,192
samples of an 8 x 8 field (the order depends only on the chunk grid), the distinct chunks per
batch of the first batch, of the first four, and of the whole epoch (mean over epochs 0-3), and
`shuffle_quality` of the whole epoch's order.
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

FAMILY = (1, 2, 4, 8, 16, 32)
SETTINGS = (("default", []), ("fast_first_batch", ["--fast-first-batch"]))


def store(binary: str, path: Path, spc: int, samples: int, grid: str | None = None) -> Path:
    if not (path / "zarr.json").exists():
        cmd = [binary, "make-dataset", str(path), "--samples", str(samples)]
        cmd += ["--sample-chunk", str(spc), "--force"]
        if grid:
            cmd += ["--grid", grid]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return path


def run_bench(binary: str, path: Path, flags: list[str], settle: float, env: dict | None = None) -> dict:
    """`insitubatch bench --epochs 3 --json` in a fresh process after `settle` s of idle."""
    time.sleep(settle)
    out = subprocess.run(
        [binary, "bench", str(path), "--epochs", "3", "--json", *flags],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    d = json.loads(out)
    e = d["epochs"]
    return {
        "ttfb_ms": e[0]["stats"]["ttfb_us"] / 1000,
        "ttfb_process_ms": e[0]["ttfb_from_process_start_ms"],
        "epoch0": e[0]["samples_per_s"],
        "steady": max(x["samples_per_s"] for x in e[1:]),
        "rss_mib": d["peak_rss_bytes"] / 2**20,
    }


def timing(binary: str, root: Path, rounds: int, settle: float) -> None:
    print("| samples/chunk | setting | first batch ms (iterator / process start) | epoch 0 samples/s "
          "| best later epoch samples/s | peak RSS MiB |")
    print("|---:|---|---:|---:|---:|---:|")
    for spc in FAMILY:
        path = store(binary, root / f"era5_spc{spc}.zarr", spc, 512)
        runs = {name: [] for name, _ in SETTINGS}
        for _ in range(rounds):
            for name, flags in SETTINGS:
                runs[name].append(run_bench(binary, path, flags, settle))
        for name, _ in SETTINGS:
            r = runs[name]
            med = {k: statistics.median(x[k] for x in r) for k in r[0]}
            spread = f"{min(x['ttfb_ms'] for x in r):.1f}–{max(x['ttfb_ms'] for x in r):.1f}"
            print(f"| {spc} | {name} | {med['ttfb_ms']:.1f} ({spread}) / {med['ttfb_process_ms']:.1f} "
                  f"| {med['epoch0']:.0f} | {med['steady']:.0f} | {med['rss_mib']:.0f} |", flush=True)


def mixing(binary: str, root: Path) -> None:
    import numpy as np

    import insitubatch as isb

    print("\n| samples/chunk | setting | distinct chunks: first batch | first four batches (mean) "
          "| whole epoch (mean) | shuffle_quality |")
    print("|---:|---|---:|---:|---:|---:|")
    for spc in FAMILY:
        path = store(binary, root / f"mix_spc{spc}.zarr", spc, 8192, grid="8x8")
        for name, _ in SETTINGS:
            ds = isb.InSituDataset(path, geometries=None, fast_first_batch=name != "default")
            first, four, whole, quality = [], [], [], []
            for epoch in range(4):
                ds.set_epoch(epoch)
                distinct, order = [], []
                for b in ds.train:
                    idx = np.asarray(b.sample_indices)
                    distinct.append(len(np.unique(idx // spc)))
                    order.extend(idx.tolist())
                first.append(distinct[0])
                four.append(sum(distinct[:4]) / 4)
                whole.append(sum(distinct) / len(distinct))
                quality.append(isb.shuffle_quality(order, spc))
            print(f"| {spc} | {name} | {statistics.mean(first):.1f} | {statistics.mean(four):.1f} "
                  f"| {statistics.mean(whole):.1f} | {statistics.mean(quality):.3f} |", flush=True)
            del ds


def family_args(description: str) -> argparse.ArgumentParser:
    """The arguments of a fresh-process benchmark over the family: where the stores live, the
    rounds, the idle before each run, and the binary."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("root", type=Path, nargs="?", default=Path(tempfile.gettempdir()) / "insitubatch-bench")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--bin", default=str(Path(__file__).resolve().parent.parent / "target/release/insitubatch"))
    return ap


def main() -> None:
    ap = family_args(__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("timing", "mixing"))
    a = ap.parse_args()
    a.root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("INSITUBATCH_LIB", str(Path(a.bin).parent / "libinsitubatch.so"))
    if a.only != "mixing":
        timing(a.bin, a.root, a.rounds, a.settle)
    if a.only != "timing":
        mixing(a.bin, a.root)


if __name__ == "__main__":
    main()
