"""`prefetch_next_epoch` against the default: what starting train's next epoch while this one
gathers its last batches does to the first batch of every later epoch, to the time a model step
waits for data, to throughput and to memory.

    cargo build --release
    python3 bench/prefetch_next_epoch.py /tmp/insitubatch-bench --rounds 3
    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \
        python3 bench/prefetch_next_epoch.py /tmp/insitubatch-bench --rounds 2 --shim
    python3 bench/prefetch_next_epoch.py /tmp/insitubatch-bench --rounds 3 --stores 8:512,32:1024

For each store (ERA5-like 181 x 360, two variables, zstd-3; made with `insitubatch
make-dataset` when missing; sizes such that the automatic budget decodes chunks into batch rows
at 8 and 32 samples per chunk), `insitubatch bench --epochs 5 --json` in a fresh process, the
two settings alternated, each run after `--settle` s of idle, once with a 10 ms model step per
batch (`--accelerator-ms 10`: a sleep, as a host waiting on an accelerator) and once without.
Reported: medians over the rounds of the later epochs' (1-4) first batch, data stall, and
samples/s (their samples over their seconds), and peak RSS. `--stores spc:samples,...` picks
other stores: 8:512 and 32:1024 are short enough that the automatic budget keeps chunks in the
pool (the early pass then takes over the running one's room as its last batches are taken),
and the table says "(through the pool)" for them.

With `--shim`, the same through the Python shim instead, on the first store of `--stores`
(default 8 samples per chunk, 2048 samples): a
fresh Python process per run iterates five epochs of `ds.train`, sleeping 10 ms per batch, and
reports each later epoch's first batch and data stall (and whether it was started early).
With `--val`, the store is split 3:1 into train and val, and val is iterated after each epoch
(10 ms per batch too, as an evaluation step): train's next epoch then follows val's pass. With
`--val --test`, it is split 2:1:1 and val and then test are iterated after each epoch: train's
next epoch then follows test's pass.

    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \
        python3 bench/prefetch_next_epoch.py /tmp/insitubatch-bench --rounds 3 --shim --val \
        --stores 8:512
    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \
        python3 bench/prefetch_next_epoch.py /tmp/insitubatch-bench --rounds 3 --shim --val \
        --test --stores 8:512
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import median

STORES = ((1, 512), (8, 2048), (32, 4096))
SETTINGS = (("default", []), ("prefetch_next_epoch", ["--prefetch-next-epoch"]))
STEPS = (10.0, 0.0)


def store(binary: str, root: Path, spc: int, samples: int) -> Path:
    path = root / f"era5_spc{spc}_{samples}.zarr"
    if not (path / "zarr.json").exists():
        cmd = [binary, "make-dataset", str(path), "--samples", str(samples)]
        cmd += ["--sample-chunk", str(spc), "--force"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return path


def run(binary: str, path: Path, flags: list[str], step_ms: float, settle: float) -> dict:
    time.sleep(settle)
    cmd = [binary, "bench", str(path), "--epochs", "5", "--json", *flags]
    if step_ms:
        cmd += ["--accelerator-ms", str(step_ms)]
    d = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    later = d["epochs"][1:]
    stalls = [e["data_stall_fraction"] for e in later if e.get("data_stall_fraction") is not None]
    return {
        "ttfb_ms": median(e["stats"]["ttfb_us"] / 1000 for e in later),
        "stall": median(stalls) if stalls else float("nan"),
        "rate": sum(e["stats"]["samples"] for e in later) / sum(e["seconds"] for e in later),
        "ahead": sum(bool(e["stats"]["started_ahead"]) for e in later),
        "rss_mib": d["peak_rss_bytes"] / 2**20,
        "decoded_into_rows": all(e["stats"]["tiles_into_batches"] > 0 for e in d["epochs"]),
    }


def stepped(split) -> dict:
    """Iterates `split`, sleeping 10 ms per batch: its first batch and data stall."""
    t0 = time.perf_counter()
    slept, first = 0.0, None
    for _ in split:
        if first is None:
            first = time.perf_counter() - t0
        s = time.perf_counter()
        time.sleep(0.010)
        slept += time.perf_counter() - s
    wall = time.perf_counter() - t0
    return {"ttfb_ms": 1e3 * first, "stall": 1 - slept / wall}


def shim_run(path: str, early: bool, between: list[str]) -> None:
    """One run through the Python shim (in its own process): five epochs, 10 ms per batch;
    with `between` (`val`, or `val` and `test`), a quarter of the chunks is each of those
    splits, iterated in that order after each epoch."""
    import insitubatch as isb

    if between:
        with isb.InSituDataset(path) as probe:
            geometries = probe.geometries
        fractions = (0.75, 0.25) if len(between) == 1 else (0.5, 0.25, 0.25)
        manifest = isb.split_by_chunk(next(iter(geometries.values())), fractions)
        ds = isb.InSituDataset(path, manifest, geometries, prefetch_next_epoch=early)
    else:
        ds = isb.InSituDataset(path, prefetch_next_epoch=early)
    epochs = []
    for epoch in range(5):
        ds.set_epoch(epoch)
        e = stepped(ds.train)
        e["ahead"] = bool(ds.stats()["started_ahead"])
        for split in between:
            e[split] = stepped(getattr(ds, split))
        epochs.append(e)
    ds.close()
    print(json.dumps(epochs[1:]))


def shim(a) -> None:
    spc, samples = a.stores[0] if a.stores != STORES else (8, 2048)
    path = store(a.bin, a.root, spc, samples)
    between = (["val", "test"] if a.test else ["val"]) if a.val else []
    what = f"{spc} samples per chunk ({samples})"
    if between:
        what += f", {' and '.join(between)} after each epoch"
    print(f"| through the Python shim, {what} | run | later epochs started early "
          "| train's first batch ms, epochs 1-4 | train's data stall, epochs 1-4 |"
          + "".join(f" {split}'s data stall, epochs 1-4 |" for split in between))
    print("|---|---:|---:|---|---|" + "---|" * len(between))
    for r in range(a.rounds):
        for name, early in (("default", "0"), ("prefetch_next_epoch", "1")):
            time.sleep(a.settle)
            cmd = [sys.executable, __file__, "--shim-run", str(path), early, ",".join(between)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            e = json.loads(out)
            ahead = sum(x["ahead"] for x in e)
            firsts = ", ".join("%.1f" % x["ttfb_ms"] for x in e)
            stalls = ", ".join("%.1f %%" % (100 * x["stall"]) for x in e)
            others = "".join(
                " " + ", ".join("%.1f %%" % (100 * x[split]["stall"]) for x in e) + " |"
                for split in between)
            print(f"| {name} | {r + 1} | {ahead} of {len(e)} | {firsts} | {stalls} |{others}",
                  flush=True)


def stores_arg(text: str) -> tuple:
    try:
        return tuple(tuple(int(x) for x in part.split(":")) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--stores wants spc:samples,... (got {text!r})") from None


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--shim-run":
        shim_run(sys.argv[2], sys.argv[3] == "1", [x for x in sys.argv[4].split(",") if x])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, nargs="?", default=Path(tempfile.gettempdir()) / "insitubatch-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--bin", default=str(Path(__file__).resolve().parent.parent / "target/release/insitubatch"))
    ap.add_argument("--shim", action="store_true", help="through the Python shim instead")
    ap.add_argument("--val", action="store_true",
                    help="with --shim: a validation split iterated after each epoch")
    ap.add_argument("--test", action="store_true",
                    help="with --shim --val: a test split iterated after val each epoch")
    ap.add_argument("--stores", type=stores_arg, default=STORES,
                    help="samples per chunk and samples of each store, as spc:samples,...")
    a = ap.parse_args()
    a.root.mkdir(parents=True, exist_ok=True)
    if a.shim:
        shim(a)
        return
    print("| samples/chunk (samples) | model step | setting | later epochs started early | first batch ms "
          "| data stall | samples/s | peak RSS MiB |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for spc, samples in a.stores:
        path = store(a.bin, a.root, spc, samples)
        # Warm the page cache: every file read once.
        for f in path.rglob("*"):
            if f.is_file():
                f.read_bytes()
        for step in STEPS:
            runs = {name: [] for name, _ in SETTINGS}
            for _ in range(a.rounds):
                for name, flags in SETTINGS:
                    runs[name].append(run(a.bin, path, flags, step, a.settle))
            for name, _ in SETTINGS:
                r = runs[name]
                med = {k: median(x[k] for x in r) for k in ("ttfb_ms", "stall", "rate", "rss_mib")}
                rows = "" if all(x["decoded_into_rows"] for x in r) else " (through the pool)"
                stall = "—" if not step else f"{100 * med['stall']:.1f} %"
                print(f"| {spc} ({samples}){rows} | {step:.0f} ms | {name} | {min(x['ahead'] for x in r)}–"
                      f"{max(x['ahead'] for x in r)} of 4 | {med['ttfb_ms']:.1f} "
                      f"({min(x['ttfb_ms'] for x in r):.1f}–{max(x['ttfb_ms'] for x in r):.1f}) | {stall} "
                      f"| {med['rate']:.0f} | {med['rss_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
