"""Per-sample random augmentation as batch transforms, reproducible by construction.

Each sample's random draw is a function of (seed, epoch, sample index) only, the way the epoch's
order is a function of (seed, epoch): not of the batch it lands in, the batch size, the order,
the number of ranks or whether the run was stopped and resumed. So an augmented run can be
repeated exactly, and a resumed epoch sees the crops the unbroken one would have.

    import insitubatch as isb
    from insitubatch.augment import RandomCrop

    # ERA5 fields cut into 64 x 64 patches, the input and its target 6 steps on at one place
    g = isb.open_geometries("era5.zarr")["t2m"]
    ds = isb.InSituDataset("era5.zarr", geometries={"x": g, "y": g.shift(6)}, batch_size=64,
                           batch_transforms=[RandomCrop((64, 64), seed=1)])

`RandomCrop` reads whole fields (what the pool holds and the cache keeps) and cuts the window
out of the batch: a new window every epoch at no extra read. `sample_random_bits` gives the same
kind of draw to an augmentation of your own.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ._core import Batch, _check_int

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function on uint64 arrays (multiplications wrap)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_random_bits(seed: int, epoch: int, sample_indices, streams: int = 1) -> np.ndarray:
    """Random bits for each sample: a (len(sample_indices), streams) uint64 array whose row is a
    function of (seed, epoch, sample index) only, and whose columns are independent streams (one
    per random quantity a sample needs). ``bits % n`` draws from range(n) (the bias is below
    n / 2**64)."""
    seed = _check_int("seed", seed, 0)  # below 2**64, as the library takes it
    epoch = _check_int("epoch", epoch, 0)
    streams = _check_int("streams", streams, 1)
    samples = np.asarray(sample_indices)
    if samples.ndim != 1 or not np.issubdtype(samples.dtype, np.integer):
        raise ValueError("`sample_indices` must be a 1-D array of integers")
    if samples.size and samples.min() < 0:
        raise ValueError("`sample_indices` must not be negative")
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed], dtype=np.uint64) + _GOLDEN)
        key = _mix(key ^ np.uint64(epoch))
        per_sample = _mix(key ^ samples.astype(np.uint64))
        stream = np.arange(1, streams + 1, dtype=np.uint64) * _GOLDEN
        return _mix(per_sample[:, None] + stream[None, :])


class RandomCrop:
    """A batch transform that cuts each sample's field down to a window of `size`, at an origin
    drawn at random per sample and epoch (`sample_random_bits`), the same window for every label
    it crops: an input, its target (a `shift` of it) and a mask stay co-registered.

    size: the window's extent along each cropped axis.
    labels: the labels to crop (default every label of the batch); they must have the same
        extents along the cropped axes (a (level, lat, lon) field and a (lat, lon) mask do).
    axes: the field axes to crop, 0 being the first axis after the batch axis (default the
        last ``len(size)``).
    wrap: per cropped axis (or one bool for all), whether the axis is periodic, so that a
        window may run across its end (longitude on a global grid); without it, windows lie
        inside the field.
    seed: the draw's seed (independent of the dataset's; the epoch comes from the batch).

    The cropped arrays are new C-contiguous arrays; other labels are left as they are.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        *,
        labels: Sequence[str] | None = None,
        axes: Sequence[int] | None = None,
        wrap: bool | Sequence[bool] = False,
        seed: int = 0,
    ):
        sizes = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
        if not sizes:
            raise ValueError("RandomCrop: `size` needs at least one extent")
        self.size = tuple(_check_int("size", s, 1) for s in sizes)
        k = len(self.size)
        if axes is None:
            self.axes = tuple(range(-k, 0))
        else:
            self.axes = tuple(_check_int("axes", a, -(1 << 31)) for a in axes)
            if len(self.axes) != k:
                raise ValueError(f"RandomCrop: {len(self.axes)} axes for a {k}-axis `size`")
        wraps = (wrap,) * k if isinstance(wrap, bool) else tuple(wrap)
        if len(wraps) != k or not all(isinstance(w, bool) for w in wraps):
            raise ValueError(f"RandomCrop: `wrap` must be a bool or {k} bools")
        self.wrap = wraps
        if labels is not None and (isinstance(labels, str) or not labels):
            raise ValueError("RandomCrop: `labels` must be a non-empty list of labels")
        self.labels = None if labels is None else list(labels)
        self.seed = _check_int("seed", seed, 0)

    def __repr__(self) -> str:
        return (f"RandomCrop(size={self.size}, labels={self.labels}, axes={self.axes}, "
                f"wrap={self.wrap}, seed={self.seed})")

    def _layout(self, batch: Batch) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
        """The array axes cropped in each label, and their extents (checked to be the same for
        every label, and to hold the window)."""
        labels = list(batch.arrays) if self.labels is None else self.labels
        missing = [label for label in labels if label not in batch.arrays]
        if missing:
            raise KeyError(f"RandomCrop: no label(s) {missing}; the batch has {list(batch.arrays)}")
        axes: dict[str, tuple[int, ...]] = {}
        extents: tuple[int, ...] = ()
        for label in labels:
            inner = batch.arrays[label].ndim - 1
            resolved = tuple(a + inner if a < 0 else a for a in self.axes)
            if any(not 0 <= a < inner for a in resolved) or len(set(resolved)) != len(resolved):
                raise ValueError(
                    f"RandomCrop: label {label!r} has {inner} field axes; cannot crop axes "
                    f"{self.axes} (pass `labels=` to crop only some labels)"
                )
            axes[label] = tuple(a + 1 for a in resolved)
            label_extents = tuple(batch.arrays[label].shape[a] for a in axes[label])
            if not extents:
                extents, first = label_extents, label
            elif label_extents != extents:
                raise ValueError(
                    f"RandomCrop: labels {first!r} and {label!r} differ along the cropped axes "
                    f"({extents} against {label_extents}); one window cannot fit both"
                )
        for extent, size, axis in zip(extents, self.size, axes[first]):
            if size > extent:
                raise ValueError(
                    f"RandomCrop: a window of {size} does not fit field axis {axis - 1} of "
                    f"{first!r}, of length {extent} (cropping {labels})"
                )
        return axes, extents

    def origins(self, batch: Batch) -> np.ndarray:
        """Each row's window origin along each cropped axis: a (len(batch), len(size)) int64
        array (on a wrapped axis the window continues past the end at index 0)."""
        _, extents = self._layout(batch)
        return self._origins(batch, extents)

    def _origins(self, batch: Batch, extents: tuple[int, ...]) -> np.ndarray:
        bits = sample_random_bits(self.seed, batch.epoch, batch.sample_indices, len(self.size))
        span = np.array([e if w else e - s + 1 for e, s, w in zip(extents, self.size, self.wrap)],
                        dtype=np.uint64)
        return (bits % span).astype(np.int64)

    def __call__(self, batch: Batch) -> Batch:
        axes, extents = self._layout(batch)
        origins = self._origins(batch, extents)
        for label, label_axes in axes.items():
            batch.arrays[label] = _crop(batch.arrays[label], label_axes, self.size, origins,
                                        self.wrap)
        return batch


def _crop(x: np.ndarray, axes: tuple[int, ...], size: tuple[int, ...], origins: np.ndarray,
          wrap: tuple[bool, ...]) -> np.ndarray:
    """Row i of `x` cut to `size` along `axes` (array axes, after the batch axis) from
    `origins[i]`: all rows at once through a strided view, or, with a periodic axis, row by
    row (a slice along each other axis, indices modulo the length along a periodic one), which
    measured faster there (`docs/benchmarks.md`, "Random crops")."""
    if not any(wrap):
        return np.ascontiguousarray(_windows(x, list(axes), list(size), origins))
    shape = list(x.shape)
    for axis, extent in zip(axes, size):
        shape[axis] = extent
    out = np.empty(shape, dtype=x.dtype)
    steps = [np.arange(extent) for extent in size]
    for r in range(x.shape[0]):
        index: list = [slice(None)] * (x.ndim - 1)
        for axis, extent, origin, periodic in zip(axes, size, origins[r], wrap):
            if not periodic:
                index[axis - 1] = slice(origin, origin + extent)
        row = x[r][tuple(index)]
        for axis, step, origin, periodic in zip(axes, steps, origins[r], wrap):
            if periodic:
                row = np.take(row, (origin + step) % x.shape[axis], axis=axis - 1)
        out[r] = row
    return out


def _windows(x: np.ndarray, axes: list[int], size: list[int], origins: np.ndarray) -> np.ndarray:
    """One window per row, each inside the array: a strided view of every window (no copy),
    indexed by row and origin, which copies each window as a block. Axes keep their places."""
    view = sliding_window_view(x, size, axis=tuple(axes))
    index: list = [slice(None)] * x.ndim
    index[0] = np.arange(x.shape[0])
    for k, axis in enumerate(axes):
        index[axis] = origins[:, k]
    # The result is (rows, the axes not cut in order, the windows in `axes` order).
    out = view[tuple(index)]
    order = [a for a in range(1, x.ndim) if a not in axes] + list(axes)
    return out.transpose([0] + [1 + order.index(a) for a in range(1, x.ndim)])
