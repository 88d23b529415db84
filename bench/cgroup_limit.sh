#!/usr/bin/env bash
# Runs `insitubatch bench STORE --epochs EPOCHS [ARGS...]` under hard memory limits (cgroup v1,
# root): for each limit in MiB, whether the pass refused to start (exit 1, the message), was
# killed by the kernel for memory (exit 137) or finished, and the cgroup's peak usage.
#
#   LIMITS="200 220 252 254" EPOCHS=30 bench/cgroup_limit.sh STORE [ARGS...]
set -uo pipefail
store=$1
shift
bin=$(dirname "$0")/../target/release/insitubatch
cg=/sys/fs/cgroup/memory/insitubatch-limit-$$
if ! mkdir "$cg" 2>/dev/null; then
  echo "needs root and a cgroup v1 memory hierarchy at /sys/fs/cgroup/memory" >&2
  exit 2
fi
trap 'rmdir "$cg" 2>/dev/null' EXIT
out=$(mktemp)
for mib in ${LIMITS:-200 220 252 254 260}; do
  echo $((mib << 20)) >"$cg/memory.limit_in_bytes"
  echo 0 >"$cg/memory.max_usage_in_bytes"
  # The child moves itself into the cgroup before it becomes the benchmark.
  bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
    "$bin" bench "$store" --epochs "${EPOCHS:-30}" "$@" >"$out" 2>&1
  rc=$?
  peak=$(($(cat "$cg/memory.max_usage_in_bytes") >> 20))
  case $rc in
    0) what="finished ($(tail -1 "$out"))" ;;
    1) what="refused: $(tail -1 "$out" | cut -c1-160)..." ;;
    137) what="killed by the kernel for memory" ;;
    *) what="exit $rc" ;;
  esac
  echo "limit $mib MiB: peak usage $peak MiB, $what"
done
rm -f "$out"
