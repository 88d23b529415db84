#!/usr/bin/env bash
# How the memory need a pass is checked against (`insitubatch memory`) compares with the peak
# RSS the same pass reaches, per store of the engine family and per knob set, each in a fresh
# process. The need counts the library's memory; the program hosting it comes on top, here the
# CLI binary's own pages and heap, measured as the peak RSS of `insitubatch --help`.
# Usage: bench/memory_need.sh [DIR] [EPOCHS]
set -euo pipefail
dir=${1:-${TMPDIR:-/tmp}/insitubatch-bench}
epochs=${2:-3}
bin=$(dirname "$0")/../target/release/insitubatch
mkdir -p "$dir"
host=$(python3 -c '
import resource, subprocess, sys
subprocess.run([sys.argv[1], "--help"], stdout=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)' "$bin")
printf 'the CLI alone (insitubatch --help): %.1f MiB peak RSS\n' "$(python3 -c "print($host / 2**20)")"
printf '%-16s %-38s %9s %9s %9s %14s\n' store knobs need_MiB rss_MiB rss/need "(rss-cli)/need"
for spc in 1 2 4 8 16 32; do
  store="$dir/era5_spc$spc.zarr"
  if [ ! -e "$store/zarr.json" ]; then
    "$bin" make-dataset "$store" --samples 512 --sample-chunk "$spc" --force >/dev/null
  fi
  for knobs in "" "--cache-budget-bytes split" "--batch-size 128 --prefetch-depth 4" \
               "--block-chunks 4 --batch-size 8"; do
    # shellcheck disable=SC2086 # the knobs are words
    out=$("$bin" bench "$store" --epochs "$epochs" --json $knobs)
    python3 - "$store" "$knobs" "$out" "$host" <<'PY'
import json, os, sys
store, knobs, out = sys.argv[1], sys.argv[2] or "(defaults)", json.loads(sys.argv[3])
host = int(sys.argv[4])
need, rss = out["memory_need_bytes"], out["peak_rss_bytes"]
print(f"{os.path.basename(store):<16} {knobs:<38} {need / 2**20:9.1f} {rss / 2**20:9.1f} "
      f"{rss / need:9.2f} {(rss - host) / need:14.2f}")
PY
  done
done
