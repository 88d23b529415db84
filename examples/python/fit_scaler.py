"""Fit a standard scaler over the loader itself, then train on standardised batches without
decoding anything again (the spec's "fit at the batch stage, warming the cache").

Pass 1 reads every training sample once, raw, accumulating each variable's mean and standard
deviation, while a persistent cache directory keeps every decoded chunk. Training then reopens
the same cache: every chunk revives with no fetch and no decode, and the fitted statistics are
applied per batch. The cache holds raw chunks, so it stays valid whatever statistics you fit
next; standardising as a chunk transform instead (`insitubatch.transforms.Standardize`) would
cache the standardised chunks and make the cache stale at every re-fit.

    insitubatch make-dataset /tmp/era5.zarr
    python examples/python/fit_scaler.py /tmp/era5.zarr /tmp/era5-cache/raw
"""

import sys

import numpy as np

import insitubatch as isb


class RunningMoments:
    """Mean and variance of everything seen, merged batch by batch in float64 (Chan et al.)."""

    def __init__(self):
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def update(self, x: np.ndarray) -> None:
        x = x.astype(np.float64, copy=False)
        n, mean = x.size, float(x.mean())
        m2 = float(((x - mean) ** 2).sum())
        delta, total = mean - self.mean, self.n + n
        self.mean += delta * n / total
        self.m2 += m2 + delta**2 * self.n * n / total
        self.n = total

    @property
    def std(self) -> float:
        return (self.m2 / self.n) ** 0.5


def main(store: str, cache: str) -> None:
    # Pass 1: fit, and warm the cache with the raw decoded chunks.
    with isb.InSituDataset(store, batch_size=64, cache_dir=cache, persist=True) as ds:
        moments = {label: RunningMoments() for label in ds.geometries}
        for batch in ds.train:
            for label, m in moments.items():
                m.update(batch.arrays[label])
        stats = {label: (np.float32(m.mean), np.float32(m.std)) for label, m in moments.items()}
        for label, (mean, std) in stats.items():
            print(f"fit {label}: mean {mean:.3f}, std {std:.3f}")

    def standardise(batch: isb.Batch) -> isb.Batch:
        for label, (mean, std) in stats.items():
            batch.arrays[label] = (batch.arrays[label] - mean) / std
        return batch

    # Training: the raw chunks revive from the cache; the batches come out standardised.
    with isb.InSituDataset(store, batch_size=64, cache_dir=cache, persist=True,
                           batch_transforms=[standardise]) as ds:
        for epoch in range(2):
            ds.set_epoch(epoch)
            seen = {label: RunningMoments() for label in stats}
            for batch in ds.train:
                for label, m in seen.items():
                    m.update(batch.arrays[label])
            s = ds.stats()
            summary = ", ".join(f"{k} mean {m.mean:+.4f} std {m.std:.4f}" for k, m in seen.items())
            print(f"epoch {epoch}: {ds.cache_misses} misses, {ds.cache_hits} hits "
                  f"({ds.cache_revived} from cache files), {s['bytes_decoded']} bytes decoded; "
                  f"{summary}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
