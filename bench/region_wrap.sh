#!/usr/bin/env bash
# A region across the seam of a periodic axis against a plain region of the same size that
# touches as many inner chunks, interleaved in one run, on the stores bench/region.sh builds.
#
#   bench/region.sh DIR 1         # builds DIR/fat.zarr and DIR/fatshard.zarr (720 x 1440 grid)
#   bench/region_wrap.sh DIR [ROUNDS]
#
# Rows 72:220 (35-72N) and 160 columns: 280:440 (plain) against -80:80 --wrap (20W-20E on a
# 0-360 grid: columns 1360..1440 then 0..80). Both touch 2 x 2 of the 16 inner chunks of a
# field. `insitubatch bench --epochs 4 --block-chunks 4`; per run the best later epoch's
# samples/s, the bytes read and decoded and the tiles read in the last epoch, and the peak RSS.
set -euo pipefail
dir=${1:?usage: bench/region_wrap.sh DIR [ROUNDS]}
rounds=${2:-3}
bin=${INSITUBATCH:-target/release/insitubatch}
report() { python3 "$(dirname "$0")/region_report.py" "$@"; }
knobs=(--variables t2m,u10 --epochs 4 --block-chunks 4 --json)
for r in $(seq "$rounds"); do
    echo "round $r"
    for store in fat fatshard; do
        find "$dir/$store.zarr" -type f -exec cat {} + >/dev/null   # warm the page cache
        "$bin" bench "$dir/$store.zarr" "${knobs[@]}" --region 72:220,280:440 2>/dev/null \
            | report "$store" "280:440"
        "$bin" bench "$dir/$store.zarr" "${knobs[@]}" --region=72:220,-80:80 --wrap 2>/dev/null \
            | report "$store" "-80:80 --wrap"
    done
done
