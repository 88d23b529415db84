"""What the device under a cache directory can read with its pages dropped: the ceiling for a
revival epoch that is not served from the page cache (docs/benchmarks.md, "NVMe tier"). Reads
every slot file (`*.npy`) whole in 1 MiB reads from N threads at once, after
`posix_fadvise(DONTNEED)` on each, for each thread count given; prints MB/s.

    python3 bench/device_read.py /tmp/cb/rev 1 4 16 64
"""

import argparse
import glob
import os
import time
from concurrent.futures import ThreadPoolExecutor


def drop_pages(files):
    os.sync()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_whole(path):
    n = 0
    with open(path, "rb", buffering=0) as f:
        while block := f.read(1 << 20):
            n += len(block)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cache_dir")
    ap.add_argument("threads", nargs="+", type=int)
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.cache_dir, "*.npy")))
    if not files:
        raise SystemExit(f"no .npy slot files in {args.cache_dir}: fill a persistent cache first")
    for threads in args.threads:
        drop_pages(files)
        t = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(read_whole, files))
        dt = time.perf_counter() - t
        print(f"{threads:3d} threads: {total / dt / 1e6:6.0f} MB/s ({total / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
