"""A leak soak: many epochs, and many datasets opened and closed, in one process, with the
resident set size read after each. A loader that leaks shows a slope; one that is bounded by its
dials shows a flat line after the first epochs.

    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \\
        python bench/soak.py STORE [EPOCHS] [DATASETS]

Three phases, each sampling RSS ten times, one second after its tenth, twentieth, ...
epoch or dataset (so that what the allocator frees late has been freed), and printing the
samples, their maximum and the growth from the second sample to the last:
  1. `EPOCHS` shuffled epochs of one dataset (default budget: nearly every chunk decoded every
     epoch), with a Python function as a chunk transform;
  2. the same with the budget holding the split (every later epoch all hits);
  3. `DATASETS` datasets opened, iterated for part of an epoch, and closed, with a function.
"""

import os
import sys
import time

import numpy as np

import insitubatch as isb
from insitubatch.transforms import Affine, Function

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def sample(series: list, i: int, n: int) -> None:
    """Appends (i + 1, RSS) after the tenth, twentieth, ... of `n` steps, one second later."""
    if (i + 1) % max(n // 10, 1) == 0:
        time.sleep(1.0)
        series.append((i + 1, rss_mib()))


def report(name: str, unit: str, series: list) -> None:
    points = ", ".join(f"{i}: {r:.0f}" for i, r in series)
    grew = series[-1][1] - series[min(1, len(series) - 1)][1]
    print(f"{name}: RSS MiB after {unit}s {points}; max {max(r for _, r in series):.1f}, "
          f"{grew:+.1f} MiB from the second sample to the last", flush=True)


def in_place(x):
    np.multiply(x, np.float32(1.0), out=x)
    return x


def main() -> None:
    store = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    datasets = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    transforms = [Function(in_place, identity="soak"), Affine(offset=0.0)]
    t0 = time.perf_counter()

    for name, budget in (("cold epochs", None), ("resident epochs", 1 << 31)):
        series = []
        with isb.InSituDataset(store, chunk_transforms=transforms,
                               cache_budget_bytes=budget) as ds:
            for epoch in range(epochs):
                ds.set_epoch(epoch)
                for _ in ds.train:
                    pass
                sample(series, epoch, epochs)
        report(name, "epoch", series)

    series = []
    for i in range(datasets):
        with isb.InSituDataset(store, chunk_transforms=transforms, seed=i) as ds:
            for n, _ in enumerate(ds.train):
                if n == 3:
                    break
        sample(series, i, datasets)
    report("datasets opened and closed", "dataset", series)
    print(f"{time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
