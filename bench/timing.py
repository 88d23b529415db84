"""Timing helpers shared by the Python benchmark scripts (run as `python bench/NAME.py`, which
puts this directory on the import path)."""

import time


def epoch_rate(ds, split: str = "train") -> float:
    """Samples per second of one epoch of `split`, every batch taken and dropped."""
    n, start = 0, time.perf_counter()
    for b in getattr(ds, split):
        n += len(b)
    return n / (time.perf_counter() - start)


def median(xs) -> float:
    """The median of `xs` (not `statistics.median`: this directory's statistics.py shadows the
    standard module for the scripts here)."""
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
