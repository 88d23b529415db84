#!/usr/bin/env bash
# What chunk transforms cost the engine: `insitubatch bench` without and with a pipeline on every
# variable (by default standardize, then clip), in interleaved pairs of fresh processes, two runs
# each: cold (the default budget, the working set, so every epoch decodes and transforms nearly
# every chunk; the median of epochs 1-5) and resident (the budget holds the split, so epochs 1-5
# are all hits, which must cost the same with and without transforms: a hit holds the
# transformed chunk, or cheaper when it is smaller). Samples per second, since a reshaping
# pipeline delivers other bytes per sample. Prints each run, then the medians and their ratios.
#
#   bench/transform_cost.sh STORE [PAIRS] [PIPELINE_JSON]
set -euo pipefail
store=$1
pairs=${2:-3}
bin=$(dirname "$0")/../target/release/insitubatch
python=${PYTHON:-python3}
pipeline=${3:-'[{"type": "standardize", "mean": 280.0, "std": 20.0}, {"type": "clip", "min": -5.0, "max": 5.0}]'}
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for _ in $(seq "$pairs"); do
  for mode in plain transformed; do
    args=()
    [[ $mode == transformed ]] && args=(--chunk-transforms "$pipeline")
    for kind in cold resident; do
      budget=()
      [[ $kind == resident ]] && budget=(--cache-budget-bytes split)
      "$bin" bench "$store" --epochs 6 --json "${budget[@]}" "${args[@]}" |
        "$python" -c '
import json, statistics, sys
r = json.load(sys.stdin)["epochs"][1:]
hits = sum(e["stats"]["cache_hits"] for e in r)
misses = sum(e["stats"]["cache_misses"] for e in r)
print(json.dumps({"mode": sys.argv[1], "kind": sys.argv[2],
                  "samples_s": statistics.median(e["samples_per_s"] for e in r),
                  "hit_fraction": round(hits / (hits + misses), 3)}))' "$mode" "$kind" |
        tee -a "$results"
    done
  done
done
"$python" - "$results" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
med = {(m, k): statistics.median(r["samples_s"] for r in runs if (r["mode"], r["kind"]) == (m, k))
       for m in ("plain", "transformed") for k in ("cold", "resident")}
for k in ("cold", "resident"):
    print(f"{k:>8} epochs: plain {med['plain', k]:8.0f} samples/s, transformed"
          f" {med['transformed', k]:8.0f} samples/s = {med['transformed', k] / med['plain', k]:.3f}x")
PY
