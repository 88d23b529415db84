#!/usr/bin/env bash
# Reading a region of the field against reading the whole field, interleaved in one run.
#
#   bench/region.sh DIR [ROUNDS] [REGION]
#
# Builds, unless they exist, two stores of 256 samples of a 720 x 1440 float32 grid (0.25
# degree), two variables, in 180 x 360 inner chunks (16 per field): DIR/fat.zarr, one sample per
# stored chunk, and DIR/fatshard.zarr, shards of 8 samples holding those inner chunks (v3
# sharding). Then runs ROUNDS (default 3) rounds of `insitubatch bench --epochs 4
# --block-chunks 4` (so that every epoch reads: the working set is a quarter of the split) over
# the whole field and over REGION (default 72:220,0:160: 35-72N, 0-40E, which touches 2 of the 16
# inner chunks), one after the other, and prints per run the best later epoch's samples/s, the
# bytes read and decoded and the tiles read in the last epoch, and the peak RSS.
set -euo pipefail
dir=${1:?usage: bench/region.sh DIR [ROUNDS] [REGION]}
rounds=${2:-3}
region=${3:-72:220,0:160}
bin=${INSITUBATCH:-target/release/insitubatch}
mkdir -p "$dir"
make() {
    local store=$1
    shift
    if [ ! -e "$store/zarr.json" ]; then
        "$bin" make-dataset "$store" --samples 256 --grid 720x1440 --sample-chunk 1 \
            --inner-chunks 180x360 "$@" >/dev/null
    fi
    find "$store" -type f -exec cat {} + >/dev/null   # warm the page cache
}
make "$dir/fat.zarr"
make "$dir/fatshard.zarr" --shard-samples 8
report() { python3 "$(dirname "$0")/region_report.py" "$@"; }
knobs=(--variables t2m,u10 --epochs 4 --block-chunks 4 --json)
for r in $(seq "$rounds"); do
    echo "round $r"
    for store in fat fatshard; do
        "$bin" bench "$dir/$store.zarr" "${knobs[@]}" 2>/dev/null | report "$store" "whole field"
        "$bin" bench "$dir/$store.zarr" "${knobs[@]}" --region "$region" 2>/dev/null \
            | report "$store" "region"
    done
done
