"""Several patches per sample of a field stored in many chunks: the stored chunks under any of
a sample's windows read once (since the thirty-ninth session) against the whole field read for
them (the binary before), in the same run (docs/benchmarks.md, "Several patches of a field
stored in many chunks").

    cargo build --release
    git worktree add /tmp/isb-before 679598a && (cd /tmp/isb-before && cargo build --release) \
        && cp /tmp/isb-before/target/release/insitubatch /tmp/insitubatch-before
    python3 bench/patch_regions.py /tmp/insitubatch-before target/release/insitubatch \\
        --store /tmp/fat/tiles.zarr --rounds 3

The store (made once, with `make-dataset` of the second binary when missing): 128 samples of
720 x 1440 float32, one sample per chunk, stored as 8 x 8 chunks of 90 x 180, zstd-3, one
variable. Other layouts, each with a store path of its own: `--shard-samples N` stores each
N samples as one shard holding those chunks as inner chunks (`make-dataset --shard-samples N`,
e.g. /tmp/fat/shards.zarr with 1 and /tmp/fat/shards8.zarr with 8), `--sample-chunk K` chunk
files of K samples (/tmp/fat/tiles4.zarr with 4). Since the fortieth session several patches
of a shard read the inner chunks under any window once, and chunks of several samples read
each sample's stored (inner) chunks under its windows (a shard is one stored chunk, so "stored
chunks read" counts shards there; MiB read tells). A store whose split the automatic budget holds (16 shards of 8 samples, blocks of 16) keeps
its chunks in the pool and is read whole in epoch 0 either way; `--block-chunks 4` makes the
working set half the split, as on a store larger than memory. Each round runs `insitubatch bench STORE --epochs 3 --patch 64x64
--patches-per-sample N --json` in a fresh process for N in 1, 4 and 16 and for the 64 x 64
grid (`--patch-grid 64x64`), the two binaries alternated, page cache warm. Reported per
setting and binary: epoch 0 and the best later epoch in rows/s (medians over the rounds),
stored chunks read and MiB read per epoch, peak RSS.

`--next` reads `t2m` and its next sample `t2m_next` (`--window t2m_next=t2m:1`), cut from the
same patches, a forecast's input and target: each chunk feeds rows of two labels, so it goes
through the pool, which since the forty-first session loads only the stored (inner) chunks
under the windows of both (region slots). `--before-env NAME=VALUE` sets a variable for the
"before" runs only, for a comparison binary with a throwaway switch:

    python3 bench/patch_regions.py /tmp/insitubatch-switch /tmp/insitubatch-switch --next \
        --before-env ISB_NO_REGION_SLOTS_TMP=1 --rounds 3
"""

import argparse
import json
import os
import subprocess
from pathlib import Path

from timing import median

SETTINGS = [
    ("1 per sample", ["--patches-per-sample", "1"]),
    ("4 per sample", ["--patches-per-sample", "4"]),
    ("16 per sample", ["--patches-per-sample", "16"]),
    ("grid 64x64", ["--patch-grid", "64x64"]),
]


def run(binary: str, store: Path, flags: list[str], block_chunks: int,
        env: dict[str, str] | None = None) -> dict:
    cmd = [binary, "bench", str(store), "--epochs", "3", "--patch", "64x64", *flags,
           "--block-chunks", str(block_chunks), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, **(env or {})}).stdout
    d = json.loads(out)
    epochs = d["epochs"]
    return {
        "first": epochs[0]["samples_per_s"],
        "later": max(e["samples_per_s"] for e in epochs[1:]),
        "tiles": epochs[0]["stats"]["tiles_read"],
        "mib": epochs[0]["stats"]["bytes_read"] / 2**20,
        "rss": d["peak_rss_bytes"] / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--store", type=Path, default=Path("/tmp/fat/tiles.zarr"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shard-samples", type=int, default=0,
                    help="make the store (when missing) with a shard per this many samples")
    ap.add_argument("--sample-chunk", type=int, default=1,
                    help="make the store (when missing) with chunks of this many samples")
    ap.add_argument("--block-chunks", type=int, default=16,
                    help="chunks per shuffle block (smaller: a working set short of the split)")
    ap.add_argument("--next", action="store_true",
                    help="read t2m and t2m_next, its next sample, cut from the same patches")
    ap.add_argument("--before-env", default=None, metavar="NAME=VALUE",
                    help="an environment variable set for the before runs only")
    a = ap.parse_args()
    labels = ["--variables", "t2m", "--window", "t2m_next=t2m:1"] if a.next else []
    before_env = dict([a.before_env.split("=", 1)]) if a.before_env else None
    if not (a.store / "zarr.json").exists():
        shard = ["--shard-samples", str(a.shard_samples)] if a.shard_samples else []
        subprocess.run([a.after, "make-dataset", str(a.store), "--samples", "128", "--grid",
                        "720x1440", "--sample-chunk", str(a.sample_chunk), "--inner-chunks",
                        "90x180", "--variables", "t2m", *shard], check=True)
    for f in a.store.rglob("*"):
        if f.is_file():
            f.read_bytes()
    runs = {(name, which): [] for name, _ in SETTINGS for which in ("before", "after")}
    for _ in range(a.rounds):
        for name, flags in SETTINGS:
            for which, binary in (("before", a.before), ("after", a.after)):
                env = before_env if which == "before" else None
                runs[(name, which)].append(
                    run(binary, a.store, [*labels, *flags], a.block_chunks, env))
    print("| setting | binary | epoch 0 rows/s | best later rows/s | stored chunks read | MiB read "
          "| peak RSS MiB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, _ in SETTINGS:
        for which in ("before", "after"):
            r = runs[(name, which)]
            med = {k: median(x[k] for x in r) for k in r[0]}
            print(f"| {name} | {which} | {med['first']:,.0f} | {med['later']:,.0f} "
                  f"| {med['tiles']:,.0f} | {med['mib']:.1f} | {med['rss']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
