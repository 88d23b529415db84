"""Fit a forecaster in JAX, then run it over a split in order and write every forecast into a new
Zarr array beside the archive, at the time it is valid for.

The model is a linear stencil along longitude: the field at time t + lead is the field at t plus
a weighted sum of its differences to its neighbours, x(t, j + m) - x(t, j) for m in ±1..±radius
(circular in longitude). Drifting planetary waves, as in `insitubatch make-dataset`'s stores,
are what such a stencil predicts well. Fitting is least squares in one shuffled pass over the
train split: a jitted function turns each batch, imported from the loader through DLPack
without a copy, into its normal equations, summed on the host in float64 and solved at the end.

Inference reads the chosen split sequentially (`shuffle` plays no part outside train), runs the
jitted forecast on each batch and writes it at `batch.read_indices("y")`, the times the
forecasts are valid for. Times no forecast lands on stay NaN. Forecasts are gathered into whole
chunks of the new array before they are stored, so that zarr writes each chunk once and never
reads one back (a batch ending mid-chunk would otherwise make it read, patch and rewrite that
chunk for every batch that touches it); `ds.order` says beforehand which rows the pass writes.
The stencil's weights, the lead and the source go in the array's attributes.

    insitubatch make-dataset /tmp/era5.zarr
    python examples/python/infer_jax.py /tmp/era5.zarr /tmp/forecast.zarr
    python examples/python/infer_jax.py /tmp/era5.zarr /tmp/forecast.zarr --split all --lead 3
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import zarr

import insitubatch as isb
from insitubatch.frameworks import to_jax


def stencil_offsets(radius):
    """The neighbours a forecast looks at: m = -radius..-1, 1..radius grid points east."""
    return [m for m in range(-radius, radius + 1) if m != 0]


def neighbour_differences(x, radius):
    """(batch, lat, lon) -> (batch, lat, lon, 2 * radius): x(j + m) - x(j) for each offset m."""
    return jnp.stack([jnp.roll(x, -m, axis=-1) - x for m in stencil_offsets(radius)], axis=-1)


class ChunkWriter:
    """Stores rows of `array` (a new one, all fill value) one whole chunk per write. `expected`
    lists every row the pass will write; the rows of a chunk gather in a buffer until the last
    of them comes, then the chunk is written once and its buffer dropped. In order, that holds
    one or two chunks at a time; shuffled, the chunks whose rows are still to come (a shuffle
    block draws a chunk's rows close together). Rows never written keep the fill value."""

    def __init__(self, array, expected):
        self.array, self.rows = array, array.chunks[0]
        chunks, counts = np.unique(np.asarray(expected) // self.rows, return_counts=True)
        self.missing = dict(zip(chunks.tolist(), counts.tolist()))
        self.buffers = {}

    def write(self, indices, values):
        for i, v in zip(indices.tolist(), values):
            chunk, row = divmod(i, self.rows)
            if self.missing.get(chunk, 0) == 0:
                raise ValueError(f"row {i} was not expected, or came twice")
            buf = self.buffers.get(chunk)
            if buf is None:
                n = min(self.rows, self.array.shape[0] - chunk * self.rows)
                buf = np.full((n,) + values.shape[1:], self.array.fill_value, values.dtype)
                self.buffers[chunk] = buf
            buf[row] = v
            self.missing[chunk] -= 1
            if self.missing[chunk] == 0:
                start = chunk * self.rows
                self.array[start:start + len(buf)] = self.buffers.pop(chunk)

    def close(self):
        if self.buffers:
            raise ValueError(f"rows of chunks {sorted(self.buffers)} never came")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("out", help="the Zarr store to write the forecasts into (replaced)")
    ap.add_argument("--var", default="t2m")
    ap.add_argument("--lead", type=int, default=1, help="steps ahead to forecast")
    ap.add_argument("--radius", type=int, default=2, help="stencil half-width in grid points")
    ap.add_argument("--split", default="test", choices=["train", "val", "test", "all"],
                    help="the samples to forecast from")
    ap.add_argument("--batch-size", type=int, default=32)
    a = ap.parse_args()

    g = isb.open_geometries(a.store, [a.var])[a.var]
    if len(g.shape) != 3 or g.sample_axis != 0:
        ap.error(f"{a.var!r} is {g.shape} with samples along axis {g.sample_axis}: this example "
                 f"takes (time, latitude, longitude) fields")
    manifest = isb.split_by_chunk(g, (0.7, 0.1, 0.2), seed=0)  # train, val, test: whole chunks
    views = {"x": g, "y": g.shift(a.lead)}

    @jax.jit
    def normal_equations(x, y):
        d = neighbour_differences(x, a.radius).reshape(-1, 2 * a.radius)
        r = (y - x).reshape(-1)
        return d.T @ d, d.T @ r

    @jax.jit
    def forecast(x, w):
        return x + neighbour_differences(x, a.radius) @ w

    with isb.InSituDataset(a.store, manifest, views, batch_size=a.batch_size) as ds:
        # Fit: one shuffled pass over train.
        gram = np.zeros((2 * a.radius, 2 * a.radius))
        rhs = np.zeros(2 * a.radius)
        t = time.perf_counter()
        for batch in ds.train:
            arrays = to_jax(batch)
            g_b, r_b = normal_equations(arrays["x"], arrays["y"])
            gram += np.asarray(g_b, dtype=np.float64)
            rhs += np.asarray(r_b, dtype=np.float64)
        w = np.linalg.solve(gram, rhs).astype(np.float32)
        print(f"fit: {ds.train.n_samples} train samples in {time.perf_counter() - t:.2f} s; "
              f"stencil weights {np.array2string(w, precision=4, separator=', ')}")

        # Inference: the split in order, each forecast written at the time it is valid for.
        view = getattr(ds, a.split)
        shape, chunks = tuple(g.shape), tuple(g.chunks)
        out = zarr.open_group(a.out, mode="w").create_array(
            f"{a.var}_forecast", shape=shape, chunks=chunks, dtype="float32", fill_value=np.nan)
        out.attrs.update({"source": str(a.store), "variable": a.var, "lead": a.lead,
                          "stencil_offsets": stencil_offsets(a.radius),
                          "stencil_weights": w.tolist()})
        w_dev = jnp.asarray(w)
        err = np.zeros(2)  # squared error of the forecast and of persistence
        written = 0
        # The rows the pass writes: the times its forecasts are valid for, known before it runs.
        writer = ChunkWriter(out, ds.order(a.split).sample_indices + a.lead)
        t = time.perf_counter()
        for batch in view:
            arrays = to_jax(batch)
            pred = np.asarray(forecast(arrays["x"], w_dev))
            err += [float(jnp.sum((pred - arrays["y"]) ** 2)),
                    float(jnp.sum((arrays["x"] - arrays["y"]) ** 2))]
            valid = batch.read_indices("y")
            writer.write(valid, pred)
            written += len(valid)
        writer.close()
        n_values = written * int(np.prod(shape[1:]))
        mse, persistence = err / max(n_values, 1)
        print(f"{a.split}: wrote {written} forecasts of {a.var} (lead {a.lead}) to {a.out} in "
              f"{time.perf_counter() - t:.2f} s; mse {mse:.5f} against persistence "
              f"{persistence:.5f} (skill {1 - mse / persistence:+.3f})")


if __name__ == "__main__":
    main()
