"""Chunk transforms: deterministic per-chunk work the Rust decoder runs on every decoded chunk
before it is pooled and cached, so it is paid once per chunk (not per sample, not per epoch) and
a persisted cache holds its output.

    from insitubatch.transforms import Affine, Standardize, FillNaN, applies
    ds = InSituDataset("era5.zarr", chunk_transforms=[
        applies(["t2m"], Affine(offset=-273.15)),          # Kelvin to Celsius, t2m only
        applies(["t"], Standardize(mean=level_means, std=level_stds, axis=0)),  # per level
        FillNaN(0.0),                                      # every array
    ])

They run in list order. `applies` scopes a transform to arrays by path (not by label: two labels
of one array share its chunks). Arithmetic is in the array's float type, exactly as numpy's
``x * float32(scale) + float32(offset)``. `axis` names an inner axis (0 is the first axis once
the sample axis is taken out) along which parameters are lists, one value per index.

Each transform's parameters are the array's cache fingerprint: change one and a persisted
cache of the arrays it applies to is stale (construction raises `StaleCache` naming them, unless
``reset_stale_cache=True``).

`Cast` and `Coarsen` change what a sample is (its dtype, its inner shape): batches, the pool
and the cache hold the result, and ``ds.sample_formats`` says what each label's samples are.

`Function` runs a Python function on each chunk instead: the slow path, for what the
built-ins cannot say. It holds a decoder thread and the GIL while it runs, so chunks go through
it one at a time; measure before relying on it (docs/benchmarks.md has the cost of one).

Work that needs the assembled batch, several variables or per-sample randomness belongs in
``batch_transforms`` (Python callables, run per batch, not cached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from ._callbacks import ChunkInfo

__all__ = [
    "Affine", "Cast", "ChunkInfo", "Clip", "Coarsen", "FillNaN", "Function", "Preview", "Regrid",
    "Standardize", "applies", "preview", "to_config",
]


def _values(name: str, v: Any) -> float | list[float]:
    """A parameter as JSON: one number, or a 1-D list of numbers."""
    a = np.asarray(v, dtype=np.float64)
    if a.ndim > 1:
        raise ValueError(f"`{name}` must be a number or a 1-D sequence, not shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"`{name}` must be finite")
    return float(a) if a.ndim == 0 else a.tolist()


def _axis(axis: int | None) -> int | None:
    if axis is not None and (not isinstance(axis, int) or isinstance(axis, bool) or axis < 0):
        raise ValueError(f"`axis` must be None or an inner axis index >= 0, not {axis!r}")
    return axis


@dataclass(frozen=True)
class Affine:
    """``x * scale + offset`` (unit conversion, a fixed normalisation)."""

    scale: Any = 1.0
    offset: Any = 0.0
    axis: int | None = None

    def to_config(self) -> dict:
        return {
            "type": "affine",
            "scale": _values("scale", self.scale),
            "offset": _values("offset", self.offset),
            "axis": _axis(self.axis),
        }


@dataclass(frozen=True)
class Standardize:
    """``(x - mean) / std`` with statistics fitted beforehand (never per chunk)."""

    mean: Any
    std: Any
    axis: int | None = None

    def to_config(self) -> dict:
        return {
            "type": "standardize",
            "mean": _values("mean", self.mean),
            "std": _values("std", self.std),
            "axis": _axis(self.axis),
        }


@dataclass(frozen=True)
class FillNaN:
    """NaN becomes `value` (repairs the holes ``on_bad_chunk="nan"`` leaves)."""

    value: float

    def to_config(self) -> dict:
        return {"type": "fill_nan", "value": _values("value", self.value)}


@dataclass(frozen=True)
class Clip:
    """Values outside ``[min, max]`` become the bound; NaN stays NaN (as ``numpy.clip``)."""

    min: float
    max: float

    def to_config(self) -> dict:
        return {"type": "clip", "min": _values("min", self.min), "max": _values("max", self.max)}


@dataclass(frozen=True)
class Cast:
    """Elements become `dtype` (``"float32"`` or ``"float64"``) as ``numpy.astype`` makes them:
    integer arrays can then be scaled, float64 ones halved in memory."""

    dtype: Any

    def to_config(self) -> dict:
        return {"type": "cast", "dtype": np.dtype(self.dtype).name}


@dataclass(frozen=True)
class Coarsen:
    """Block means over the inner axes, one factor per inner axis (1 keeps an axis); elements
    past the last whole block are dropped (xarray's ``coarsen(boundary="trim")``), and a NaN in
    a block makes its mean NaN (``.mean(skipna=False)``). Batches then have the coarser shape
    (``ds.sample_formats``)."""

    factors: Sequence[int]

    def to_config(self) -> dict:
        factors = [int(f) for f in self.factors]
        if not factors or any(f < 1 for f in factors):
            raise ValueError(f"Coarsen: factors must be positive integers, not {self.factors!r}")
        return {"type": "coarsen", "factors": factors}


@dataclass(frozen=True)
class Regrid:
    """Onto another rectilinear grid along two inner axes: along ``axes[0]`` from ``src[0]`` to
    ``dst[0]`` coordinates, then along ``axes[1]``. ``method="linear"`` (bilinear) computes each
    pass in float64 exactly as ``numpy.interp`` does (targets outside the source range take the
    edge value; float arrays). ``method="nearest"`` copies the value at the nearest source
    coordinate, a tie going to the smaller coordinate, of any dtype: for masks and categories.
    ``method="conservative"`` gives each target cell the area-weighted mean of the source cells
    it overlaps (float arrays; cells are the spans between midpoints of neighbouring
    coordinates, so ``dst`` must be monotonic too), keeping the field's area integral; NaN
    source cells are left out and the rest re-weighted. With ``sphere=True`` the axes are
    latitude and longitude in degrees: areas on the sphere, longitude wrapping at 360°.
    Source coordinates may fall (latitudes from 90 to -90)."""

    axes: Sequence[int]
    src: Sequence[Any]
    dst: Sequence[Any]
    method: str = "linear"
    sphere: bool = False

    def to_config(self) -> dict:
        axes = [int(a) for a in self.axes]
        if len(axes) != 2 or len(self.src) != 2 or len(self.dst) != 2:
            raise ValueError("Regrid: give two axes, and src and dst coordinates for each")
        if self.method not in ("linear", "nearest", "conservative"):
            raise ValueError("Regrid: method must be 'linear', 'nearest' or 'conservative', "
                             f"not {self.method!r}")
        if not isinstance(self.sphere, bool):
            raise TypeError(f"Regrid: sphere must be a bool, not {self.sphere!r}")
        coords = lambda name, c: [_values(f"{name}[{k}]", np.ravel(v)) for k, v in enumerate(c)]
        config: dict[str, Any] = {"type": "regrid", "axes": axes,
                                  "src": coords("src", self.src), "dst": coords("dst", self.dst)}
        if self.method != "linear":
            config["method"] = self.method
        if self.sphere:
            config["sphere"] = True
        return config


class Function:
    """A Python function as a chunk transform (the slow path; prefer a built-in where one
    says it).

    ``fn(chunk)`` gets one chunk of one array as a numpy array shaped
    ``(samples_per_chunk, *inner_shape)`` and returns an array of the output shape: the input's
    unless `shape` (a sample's inner shape afterwards) says otherwise, converted to the input's
    dtype unless `dtype` says otherwise (numpy ``same_kind`` casting). The chunk is the
    decoder's own buffer: a function that keeps shape and dtype may change it in place
    (``np.multiply(x, s, out=x)``) and return it, which copies nothing and allocates nothing.
    With ``with_info=True`` it is called ``fn(chunk, info)``, `info` a `ChunkInfo` naming the
    array, the chunk's index and its first sample. The chunk is valid only during the call:
    copy what you keep.

    It must be deterministic (its output is cached as the chunk), and `identity` says what it
    is — a name and a version you change whenever its output would change. That is the cache
    fingerprint of the arrays it applies to, so a persisted cache (``persist=True``) requires
    it: the library cannot see into Python code. An exception in `fn` ends the epoch with
    `TransformError` carrying its type and message, the array and the chunk.
    """

    def __init__(self, fn, *, identity: str | None = None, shape: Sequence[int] | None = None,
                 dtype: Any = None, with_info: bool = False):
        if not callable(fn):
            raise TypeError(f"Function: {fn!r} is not callable")
        if identity is not None and (not isinstance(identity, str) or not identity.strip()):
            raise ValueError(f"Function: `identity` must be a non-empty string, not {identity!r}")
        if shape is not None:
            shape = tuple(int(n) for n in shape)
            if any(n < 1 for n in shape):
                raise ValueError(f"Function: `shape` must have positive lengths, not {shape}")
        self.fn = fn
        self.identity = identity
        self.shape = shape
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.with_info = bool(with_info)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", None) or repr(self.fn)
        return f"Function({name}, identity={self.identity!r})"

    def _config(self, position: int) -> dict:
        cfg: dict = {"type": "callback", "callback": position}
        if self.identity is not None:
            cfg["identity"] = self.identity
        if self.shape is not None:
            cfg["shape"] = list(self.shape)
        if self.dtype is not None:
            cfg["dtype"] = self.dtype.name
        return cfg


@dataclass(frozen=True)
class _Scoped:
    paths: tuple[str, ...]
    transform: Any

    def _config(self, functions: list) -> dict:
        return {**_one(self.transform, functions), "applies": list(self.paths)}

    def to_config(self) -> dict:
        return self._config([])


def applies(paths: Iterable[str] | str, transform) -> _Scoped:
    """`transform`, run only on the arrays at `paths` (array paths, not labels)."""
    if isinstance(paths, str):
        paths = [paths]
    paths = tuple(paths)
    for p in paths:
        if not isinstance(p, str):
            raise TypeError(f"applies: array paths are strings, not {type(p).__name__}")
    if not paths:
        raise ValueError("applies: name at least one array path")
    if isinstance(transform, _Scoped):
        raise TypeError("applies: the transform is already scoped")
    return _Scoped(paths, transform)


def _one(t, functions: list) -> dict:
    if isinstance(t, Function):
        functions.append(t)
        return t._config(len(functions) - 1)
    if isinstance(t, _Scoped):
        return t._config(functions)
    if hasattr(t, "to_config"):
        return t.to_config()
    if isinstance(t, dict):
        if "type" not in t:
            raise ValueError(f"chunk transform {t!r} has no 'type'")
        return dict(t)
    if callable(t):
        raise TypeError(
            f"chunk transform {t!r} is a bare Python callable: wrap it as "
            "insitubatch.transforms.Function(fn, identity='name v1'), the slow path, or use a "
            "built-in (Affine, Standardize, FillNaN, Clip, Cast, Coarsen, Regrid). Per-batch "
            "Python work goes in batch_transforms"
        )
    raise TypeError(f"chunk transform {t!r} is not a transform from insitubatch.transforms")


def to_config(transforms: Sequence) -> list[dict]:
    """The JSON list the library takes (the C config's ``chunk_transforms``). A `Function`
    becomes a ``callback`` entry numbered by its place among the list's functions."""
    return _config_and_functions(transforms)[0]


def _config_and_functions(transforms: Iterable) -> tuple[list[dict], list[Function]]:
    """The JSON list and, in the order its ``callback`` entries number them, the functions."""
    if isinstance(transforms, (str, bytes, dict)) or not isinstance(transforms, Iterable):
        raise TypeError("`chunk_transforms` must be a list of transforms")
    out: list[dict] = []
    functions: list[Function] = []
    for t in transforms:
        cfg = _one(t, functions)
        for k, v in cfg.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"chunk transform {t!r}: `{k}` must be finite")
        out.append(cfg)
    return out, functions


@dataclass(frozen=True)
class Preview:
    """One stored chunk of an array before and after a pipeline (`preview`): `before` as
    stored, `after` as batches and the cache will hold it, both ``(rows, *inner_shape)``; the
    chunk's rows start at sample `first_sample`."""

    array: str
    chunk: int
    first_sample: int
    before: np.ndarray
    after: np.ndarray


def preview(store, array: str, chunk_transforms: Sequence, *, chunk: int = 0,
            sample_axis: int = 0, storage_options=None) -> Preview:
    """Runs `chunk_transforms` on one stored chunk of `array` (its `chunk`-th along the sample
    axis) through the library, as a dataset would, and returns it before and after: to check a
    `Function`'s declared shape and dtype, or a pipeline's values, on real data before a
    training run depends on them. Raises what the dataset would: `InvalidArgument` for a
    transform that cannot apply to the array, `TransformError` for one that fails on this
    chunk. (`insitubatch check-transform` does the same for JSON pipelines, and times them.)"""
    from . import errors
    from ._core import InSituDataset, open_geometries, split_by_chunk  # _core imports this module

    g = open_geometries(store, [array], sample_axis=sample_axis,
                        storage_options=storage_options)[array]
    spc, n = g.samples_per_chunk, g.n_samples
    chunks = -(-n // spc)
    if not isinstance(chunk, int) or isinstance(chunk, bool) or not 0 <= chunk < chunks:
        raise errors.InvalidArgument(
            f"invalid argument `chunk` = {chunk!r}: array {array!r} has chunks 0 to {chunks - 1} "
            "along its sample axis"
        )
    lo, hi = chunk * spc, min(n, (chunk + 1) * spc)
    manifest = split_by_chunk(g, [1.0], sample_range=(lo, hi))

    def rows(transforms) -> np.ndarray:
        with InSituDataset(store, manifest, {"x": g}, batch_size=hi - lo, shuffle=False,
                           sample_axis=sample_axis, chunk_transforms=transforms) as ds:
            (batch,) = list(ds.train)
            return batch.arrays["x"].copy()

    return Preview(array, chunk, lo, rows([]), rows(chunk_transforms))
