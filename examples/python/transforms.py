"""Chunk transforms and batch transforms side by side (docs/tuning.md, "Where a transform runs").

Kelvin to Celsius is per element and the same every epoch: a *chunk transform*, run once per
stored chunk by the Rust decoder, on every core, and cached with the chunk (a later epoch, or a
later run with `persist=True`, does not run it again). Wind speed, sqrt(u^2 + v^2), needs two
variables of the assembled batch at once: a *batch transform*, a Python callable run on every
batch, never cached.

    insitubatch make-dataset /tmp/wind.zarr --variables t2m,u10,v10
    python examples/python/transforms.py /tmp/wind.zarr

(make-dataset fills every variable with the same kind of smooth temperature-like field, so the
"wind" of a synthetic store is only arithmetic.)
"""

import sys
import time

import numpy as np

import insitubatch as isb
from insitubatch.transforms import Affine, applies


def windspeed(batch: isb.Batch) -> isb.Batch:
    """Adds `wind`, the wind speed, from the batch's u10 and v10 (a new array per batch)."""
    batch.arrays["wind"] = np.hypot(batch.arrays["u10"], batch.arrays["v10"])
    return batch


def main(store: str) -> None:
    with isb.InSituDataset(
        store,
        batch_size=32,
        chunk_transforms=[applies("t2m", Affine(offset=-273.15))],  # t2m only: K to degC
        batch_transforms=[windspeed],
    ) as ds:
        for epoch in range(2):
            ds.set_epoch(epoch)
            start, n = time.perf_counter(), 0
            for batch in ds.train:
                t2m, wind = batch.arrays["t2m"], batch.arrays["wind"]
                n += len(batch)
            seconds = time.perf_counter() - start
            print(
                f"epoch {epoch}: {n} samples in {seconds:.2f} s; last batch t2m "
                f"{t2m.min():.1f}..{t2m.max():.1f} degC, wind {wind.min():.1f}..{wind.max():.1f}"
            )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
