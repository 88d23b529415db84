#!/usr/bin/env bash
# Read concurrency against throughput and memory (docs/benchmarks.md, "Default read
# concurrency"): on the engine family's stores, each `max_inflight` value in turn, interleaved,
# ROUNDS times: a shuffled two-epoch run in its own process (cold pool, page cache warm) printing
# epoch 0's decoded MB/s and the process's peak RSS. "auto" is the default (4 per executor).
# Usage: bench/inflight.sh [DIR] [ROUNDS] [VALUES...]
set -euo pipefail
dir=${1:-${TMPDIR:-/tmp}/insitubatch-bench}
rounds=${2:-3}
shift $(( $# > 2 ? 2 : $# ))
values=("$@")
[ ${#values[@]} -eq 0 ] && values=(auto 32)
bin=$(dirname "$0")/../target/release/insitubatch
mkdir -p "$dir"
for spc in 1 4 16; do
  store="$dir/era5_spc$spc.zarr"
  if [ ! -e "$store/zarr.json" ]; then
    "$bin" make-dataset "$store" --samples 512 --sample-chunk "$spc" --force >/dev/null
  fi
  find "$store" -type f -exec cat {} + >/dev/null
  for round in $(seq "$rounds"); do
    for mi in "${values[@]}"; do
      args=()
      [ "$mi" != auto ] && args=(--max-inflight "$mi")
      out=$("$bin" bench "$store" --epochs 2 "${args[@]}")
      mbs=$(grep -oE '^epoch 0: .* ([0-9]+) MB/s' <<<"$out" | grep -oE '[0-9]+ MB/s' | head -1)
      rss=$(grep -oE 'peak RSS [0-9.]+ [KMG]iB' <<<"$out")
      echo "spc$spc round $round max_inflight $mi: epoch 0 $mbs decoded, $rss"
    done
  done
done
