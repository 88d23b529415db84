#!/usr/bin/env python3
"""Peak resident memory of a command, sampled every 2 ms from /proc (finer than the harness's
20 ms), and what stays resident after the peak.

    python3 bench/rss_trace.py target/release/insitubatch bench STORE --epochs 4
"""
import statistics
import subprocess
import sys
import time


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
    trace = []
    while proc.poll() is None:
        try:
            trace.append(rss_mib(proc.pid))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.002)
    if proc.wait() != 0:
        sys.exit(f"{sys.argv[1]} failed with status {proc.returncode}")
    if not trace:
        sys.exit("the command ended before its memory could be sampled")
    peak = max(trace)
    after = [r for r in trace[trace.index(peak):] if r > peak / 2]
    print(f"peak RSS {peak:.0f} MiB; held after the peak (median) {statistics.median(after):.0f} MiB")


if __name__ == "__main__":
    main()
