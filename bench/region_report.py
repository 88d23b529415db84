"""One line per `insitubatch bench --json` run, for bench/region.sh and bench/region_wrap.sh.

    insitubatch bench ... --json | python3 bench/region_report.py STORE LABEL

Prints the best later epoch's samples/s (epoch 0 fills the pool), the bytes read and decoded and
the tiles read in the last epoch, and the process's peak RSS.
"""
import json
import sys

MIB = 2**20


def main() -> None:
    store, label = sys.argv[1], sys.argv[2]
    run = json.load(sys.stdin)
    later = run["epochs"][1:]
    best = max(e["samples_per_s"] for e in later)
    last = later[-1]["stats"]
    print(
        f"{store:<9} {label:<14} {best:8.0f} samples/s  read {last['bytes_read'] / MIB:7.1f} MiB"
        f"  decoded {last['bytes_decoded'] / MIB:7.1f} MiB  tiles {last['tiles_read']:6d}"
        f"  peak RSS {run['peak_rss_bytes'] / MIB:6.1f} MiB"
    )


if __name__ == "__main__":
    main()
