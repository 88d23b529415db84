#!/usr/bin/env bash
# A cropped view of a sharded store over HTTP with an object store's time to first byte:
# every later epoch reads each touched shard with one request (its index kept from the first
# epoch) instead of two. Runs `insitubatch bench --region` of BIN_A and BIN_B (default: the
# release build for both) interleaved, ROUNDS times, against tests/fixtures/http_server.py
# holding every response DELAY_MS.
#
#   bench/region.sh DIR 1                              # builds DIR/fatshard.zarr
#   bench/remote_region.sh DIR [DELAY_MS] [ROUNDS] [BIN_A] [BIN_B]
#
# Prints per run each epoch's samples/s and the last epoch's bytes read.
set -euo pipefail
dir=$(realpath "${1:?usage: bench/remote_region.sh DIR [DELAY_MS] [ROUNDS] [BIN_A] [BIN_B]}")
delay=${2:-20}
rounds=${3:-3}
here=$(dirname "$0")
a=${4:-$here/../target/release/insitubatch}
b=${5:-$a}
python=${PYTHON:-python3}
ports=$(mktemp)
trap 'rm -f "$ports"' EXIT
exec {fifo_w}> >("$python" "$here/../tests/fixtures/http_server.py" "$dir" --delay-ms "$delay" > "$ports")
for _ in $(seq 100); do [[ -s $ports ]] && break; sleep 0.05; done
url="http://127.0.0.1:$(head -1 "$ports")/fatshard.zarr"
report() {
    "$python" -c '
import json, sys
v = json.load(sys.stdin)
sps = " ".join("%5.0f" % e["samples_per_s"] for e in v["epochs"])
s = v["epochs"][-1]["stats"]
print("%-28s samples/s per epoch %s  last epoch read %6.1f MiB, %d tiles" % (
    sys.argv[1], sps, s["bytes_read"] / 2**20, s["tiles_read"]))
' "$1"
}
knobs=(--variables t2m,u10 --epochs 4 --block-chunks 4 --region 72:220,0:160 --json)
for r in $(seq "$rounds"); do
    echo "round $r"
    "$a" bench "$url" "${knobs[@]}" 2>/dev/null | report "A $(basename "$a")"
    "$b" bench "$url" "${knobs[@]}" 2>/dev/null | report "B $(basename "$b")"
done
