"""The memory need of a train pass (`ds.memory_need`) against the peak RSS a Python process
reaches running it, the interpreter's own share (its peak before the dataset opens) taken off.

    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \
        python bench/memory_need.py STORE [EPOCHS]
"""

import resource
import sys

import insitubatch as isb


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    store = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    before = peak_rss()
    with isb.InSituDataset(store) as ds:
        need = ds.memory_need("train")["total_bytes"]
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            for _ in ds.train:
                pass
    peak = peak_rss()
    mib = 2**20
    print(
        f"{store.rstrip('/').split('/')[-1]:<16} need {need / mib:6.1f} MiB, peak RSS "
        f"{peak / mib:6.1f} MiB, before opening {before / mib:5.1f} MiB: "
        f"(peak - before) / need = {(peak - before) / need:.2f}"
    )


if __name__ == "__main__":
    main()
