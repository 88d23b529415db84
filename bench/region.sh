#!/usr/bin/env bash
# Reading a region of the field against reading the whole field, interleaved in one run.
#
#   bench/region.sh DIR [ROUNDS] [REGION]
#
# Builds DIR/fat.zarr (256 samples of a 721 x 1440 float32 grid, two variables, one sample per
# chunk, 181 x 360 inner chunks: 16 tiles per sample chunk) unless it exists, then runs ROUNDS
# (default 3) rounds of `insitubatch bench --epochs 3` over the whole field and over REGION
# (default 72:220,0:160: 35-72N, 0-40E on a 0.25 degree grid, 2 of the 16 tiles), one after
# the other in each round, and prints per run the later epochs' samples/s, the bytes read and
# decoded per epoch, and the peak RSS.
set -euo pipefail
dir=${1:?usage: bench/region.sh DIR [ROUNDS] [REGION]}
rounds=${2:-3}
region=${3:-72:220,0:160}
bin=${INSITUBATCH:-target/release/insitubatch}
store=$dir/fat.zarr
mkdir -p "$dir"
if [ ! -e "$store/zarr.json" ]; then
    "$bin" make-dataset "$store" --samples 256 --grid 721x1440 --sample-chunk 1 \
        --inner-chunks 181x360 >/dev/null
fi
cat "$store"/t2m/c/*/* "$store"/u10/c/*/* >/dev/null 2>&1 || true   # warm the page cache
report() {
    python3 -c '
import json, sys
v = json.load(sys.stdin)
later = v["epochs"][1:]
sps = max(e["samples_per_s"] for e in later)
s = later[-1]["stats"]
mib = 2**20
print("%12s  %8.0f samples/s  read %7.1f MiB  decoded %7.1f MiB  tiles %5d  peak RSS %6.1f MiB" % (
    sys.argv[1], sps, s["bytes_read"] / mib, s["bytes_decoded"] / mib, s["tiles_read"],
    v["peak_rss_bytes"] / mib))
' "$1"
}
for r in $(seq "$rounds"); do
    echo "round $r"
    "$bin" bench "$store" --variables t2m,u10 --epochs 3 --json 2>/dev/null | report "whole field"
    "$bin" bench "$store" --variables t2m,u10 --epochs 3 --region "$region" --json 2>/dev/null \
        | report "region"
done
