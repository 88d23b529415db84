#!/usr/bin/env bash
# The engine benchmark of docs/benchmarks.md: ERA5-like stores (181x360 float32, zstd level 3,
# two variables, 512 samples) with 1, 2, 4, 8, 16 and 32 samples per chunk; for each, a shuffled
# epoch on a cold pool against the read layer's all-core decode ceiling (a), and a fully resident
# epoch against the in-memory gather ceiling (b). Usage: bench/engine_family.sh [DIR] [REPEAT]
set -euo pipefail
dir=${1:-${TMPDIR:-/tmp}/insitubatch-bench}
repeat=${2:-5}
bin=$(dirname "$0")/../target/release/insitubatch
mkdir -p "$dir"
for spc in 1 2 4 8 16 32; do
  store="$dir/era5_spc$spc.zarr"
  if [ ! -e "$store/zarr.json" ]; then
    "$bin" make-dataset "$store" --samples 512 --sample-chunk "$spc" --force >/dev/null
  fi
  "$bin" bench "$store" --ceilings --repeat "$repeat"
done
