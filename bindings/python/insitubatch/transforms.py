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

Work that needs the assembled batch, several variables or per-sample randomness belongs in
``batch_transforms`` (Python callables, run per batch, not cached).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

__all__ = [
    "Affine", "Cast", "Clip", "Coarsen", "FillNaN", "Regrid", "Standardize", "applies", "to_config",
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
    past the last whole block are dropped (xarray's ``coarsen(boundary="trim")``). Batches then
    have the coarser shape (``ds.sample_formats``)."""

    factors: Sequence[int]

    def to_config(self) -> dict:
        factors = [int(f) for f in self.factors]
        if not factors or any(f < 1 for f in factors):
            raise ValueError(f"Coarsen: factors must be positive integers, not {self.factors!r}")
        return {"type": "coarsen", "factors": factors}


@dataclass(frozen=True)
class Regrid:
    """Bilinear interpolation onto another rectilinear grid along two inner axes: along
    ``axes[0]`` from ``src[0]`` to ``dst[0]`` coordinates, then along ``axes[1]``, each pass in
    float64 exactly as ``numpy.interp`` computes it (targets outside the source range take the
    edge value). Source coordinates may fall (latitudes from 90 to -90)."""

    axes: Sequence[int]
    src: Sequence[Any]
    dst: Sequence[Any]

    def to_config(self) -> dict:
        axes = [int(a) for a in self.axes]
        if len(axes) != 2 or len(self.src) != 2 or len(self.dst) != 2:
            raise ValueError("Regrid: give two axes, and src and dst coordinates for each")
        coords = lambda name, c: [_values(f"{name}[{k}]", np.ravel(v)) for k, v in enumerate(c)]
        return {"type": "regrid", "axes": axes, "src": coords("src", self.src),
                "dst": coords("dst", self.dst)}


@dataclass(frozen=True)
class _Scoped:
    paths: tuple[str, ...]
    transform: Any

    def to_config(self) -> dict:
        return {**_one(self.transform), "applies": list(self.paths)}


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


def _one(t) -> dict:
    if hasattr(t, "to_config"):
        return t.to_config()
    if isinstance(t, dict):
        if "type" not in t:
            raise ValueError(f"chunk transform {t!r} has no 'type'")
        return dict(t)
    if callable(t):
        raise TypeError(
            f"chunk transform {t!r} is a Python callable; chunk transforms run in the Rust "
            "decoder and must be built-ins (insitubatch.transforms: Affine, Standardize, FillNaN, "
            "Clip, Cast, Coarsen, Regrid). Per-batch Python work goes in batch_transforms"
        )
    raise TypeError(f"chunk transform {t!r} is not a transform from insitubatch.transforms")


def to_config(transforms: Sequence) -> list[dict]:
    """The JSON list the library takes (the C config's ``chunk_transforms``)."""
    if isinstance(transforms, (str, bytes, dict)) or not isinstance(transforms, Iterable):
        raise TypeError("`chunk_transforms` must be a list of transforms")
    out = []
    for t in transforms:
        cfg = _one(t)
        for k, v in cfg.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"chunk transform {t!r}: `{k}` must be finite")
        out.append(cfg)
    return out
