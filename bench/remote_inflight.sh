#!/usr/bin/env bash
# Reads over HTTP against reads of the same store from its local directory, in one run: the
# cold first epoch of `insitubatch bench` from the directory (the baseline), then over HTTP from
# tests/fixtures/http_server.py on loopback, which holds every response DELAY_MS (an object
# store's time to first byte), at each max_inflight and at the default.
#
#   bench/remote_inflight.sh STORE_DIR [DELAY_MS] [MAX_INFLIGHT...]
#
# STORE_DIR is a store made by `insitubatch make-dataset` (it writes consolidated metadata,
# which a server that cannot list needs). Each run is a fresh process, so the pool starts
# empty; the files are in the page cache after the first.
set -euo pipefail
store=$(realpath "$1")
delay=${2:-20}
counts=("${@:3}")
[[ ${#counts[@]} -gt 0 ]] || counts=(2 8 16 32 64)
here=$(dirname "$0")
bin=$here/../target/release/insitubatch
python=${PYTHON:-python3}

# Starts a server with `--delay-ms $1`; sets $url. Its stdin is a pipe this shell holds open
# (fd $fifo_w): it stops when that is closed or the script ends.
serve() {
    exec {fifo_w}> >("$python" "$here/../tests/fixtures/http_server.py" "$(dirname "$store")" \
        --delay-ms "$1" > "$ports")
    for _ in $(seq 100); do [[ -s $ports ]] && break; sleep 0.05; done
    url="http://127.0.0.1:$(head -1 "$ports")/$(basename "$store")"
}
ports=$(mktemp)
trap 'rm -f "$ports"' EXIT

epoch0() {
    "$bin" bench "$@" --epochs 1 2>&1 |
        sed -n 's/^epoch 0: .*, \([0-9.]*\) MB\/s; first batch \([0-9.]*\) ms.*/\1 \2/p'
}
report() {
    echo "$1: $2 MB/s ($(echo "scale=2; $2 / $local_mbs" | bc)x local), first batch $3 ms"
}

read -r local_mbs local_ttfb < <(epoch0 "$store")
echo "local directory: $local_mbs MB/s, first batch $local_ttfb ms"
serve 0
read -r mbs ttfb < <(epoch0 "$url")
report "http, no delay, default max_inflight" "$mbs" "$ttfb"
exec {fifo_w}>&-
: > "$ports"
serve "$delay"
for n in "${counts[@]}"; do
    read -r mbs ttfb < <(epoch0 "$url" --max-inflight "$n")
    report "http, $delay ms per response, max_inflight $n" "$mbs" "$ttfb"
done
read -r mbs ttfb < <(epoch0 "$url")
report "http, $delay ms per response, default max_inflight" "$mbs" "$ttfb"
