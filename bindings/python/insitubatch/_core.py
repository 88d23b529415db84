"""The Python face of the engine: geometries, splits, the dataset, its views and batches.

Everything goes through the C ABI (`_lib.py`). Batch arrays alias the Rust batch buffers: each
numpy array is built on the memory of an exported DLPack tensor whose deleter runs when the last
array (or view, or tensor made from it) is garbage-collected, so closing the dataset while a batch
is referenced is safe.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import threading
import numbers
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from . import errors
from . import _callbacks
from . import transforms as _transforms
from ._lib import DATA_OFFSET, lib

_END_OF_EPOCH = 1
_TIMED_OUT = 16
# How long one wait for a batch lasts inside the library before Python gets control back, so
# that Ctrl-C (or any signal handler) runs within this many milliseconds while a batch is slow.
_WAIT_SLICE_MS = 100


def _check(status: int, err: ctypes.c_void_p) -> int:
    """Raises the error a failed call reported, with the Rust message."""
    if status in (0, _END_OF_EPOCH, _TIMED_OUT):
        return status
    if err.value:
        message = lib.isb_error_message(err).decode("utf-8", "replace")
        lib.isb_error_free(err)
    else:
        message = f"insitubatch call failed with status {status}"
    raise errors.from_status(status, message)


def _interruptible(call: Callable[[], Any], discard: Callable[[Any], None]) -> Any:
    """Runs `call` (one blocking library call) on a helper thread and waits for it in slices, so
    that Ctrl-C interrupts the wait even when the store never answers (a hung parallel file
    system). The call itself cannot be cancelled: it goes on, and `discard` frees whatever it
    returns once nobody wants it."""
    box: dict = {}
    guard = threading.Lock()

    def run():
        try:
            result = (True, call())
        except BaseException as e:  # delivered to the waiter, or dropped with the result
            result = (False, e)
        with guard:
            if box.get("abandoned"):
                if result[0]:
                    discard(result[1])
            else:
                box["result"] = result

    helper = threading.Thread(target=run, name="insitubatch-open", daemon=True)
    helper.start()
    try:
        while helper.is_alive():
            helper.join(_WAIT_SLICE_MS / 1000)
    except BaseException:
        with guard:
            box["abandoned"] = True
            ok, value = box.pop("result", (False, None))
        if ok:
            discard(value)
        raise
    ok, value = box["result"]
    if not ok:
        raise value
    return value


def _call_interruptible(fn, *args, free) -> ctypes.c_void_p:
    """`fn(*args, &out, &err)`, a library call that reads the store (metadata), run through
    `_interruptible`: returns `out`, or raises the call's error. `free` releases an `out`
    nobody took (after Ctrl-C)."""

    def call():
        out = ctypes.c_void_p()
        err = ctypes.c_void_p()
        return fn(*args, ctypes.byref(out), ctypes.byref(err)), out, err

    def discard(result):
        _, out, err = result
        if out.value:
            free(out)
        if err.value:
            lib.isb_error_free(err)

    status, out, err = _interruptible(call, discard)
    _check(status, err)
    return out


def _address(p: ctypes.c_void_p, what: str) -> int:
    """The address a call returned through `p`; NULL there would be a bug in the library."""
    if not p.value:
        raise errors.InternalError(f"the library returned a NULL {what}")
    return p.value


def _take_string(p: ctypes.c_void_p) -> str:
    try:
        return ctypes.string_at(_address(p, "string")).decode("utf-8")
    finally:
        lib.isb_string_free(p)


def _json_call(fn, *args) -> Any:
    out = ctypes.c_void_p()
    err = ctypes.c_void_p()
    _check(fn(*args, ctypes.byref(out), ctypes.byref(err)), err)
    return json.loads(_take_string(out))


def _store_str(store) -> str:
    """A store as text: a local directory path (str, bytes or os.PathLike) or a URL (s3://,
    gs://, az://, abfs://, http(s)://)."""
    if isinstance(store, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(store))
    raise TypeError(
        f"`store` must be a path (str or os.PathLike) or a URL, not {type(store).__name__}"
    )


def _storage_options(options) -> dict[str, Any]:
    """Object-store options as the C config takes them: string keys, scalar values."""
    if not isinstance(options, Mapping):
        raise TypeError(f"`storage_options` must be a mapping, not {type(options).__name__}")
    out = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise TypeError(f"storage_options: key {key!r} must be a str")
        if not isinstance(value, (str, bool, int, float)):
            raise TypeError(
                f"storage_options[{key!r}] must be a str, bool or number, not {type(value).__name__}"
            )
        out[key] = value
    return out


def _path(store) -> bytes:
    return os.fsencode(_store_str(store))


@dataclass(frozen=True)
class ArrayGeometry:
    """One variable's geometry: physical shape and stored-chunk shape, the sample axis, the
    window offset (`shift`) and the field region read (`crop`; `None` for the whole field).
    `storage_options` are the object-store options the store was opened with (`split_by_chunk`
    and `InSituDataset` reuse them)."""

    store: str
    path: str
    shape: tuple
    chunks: tuple
    dtype: str
    sample_axis: int
    offset: int = 0
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    region: tuple | None = None
    static: bool = False

    def _sampled(self, what: str) -> None:
        if self.static:
            raise errors.InvalidArgument(
                f"array {self.path!r} is a static field: it has no sample axis, so no {what}"
            )

    @property
    def n_samples(self) -> int:
        self._sampled("samples")
        return self.shape[self.sample_axis]

    @property
    def samples_per_chunk(self) -> int:
        self._sampled("samples per chunk")
        return self.chunks[self.sample_axis]

    @property
    def field_axes(self) -> tuple:
        """The physical axes other than the sample axis, in order (every axis of a static
        field)."""
        return tuple(a for a in range(len(self.shape)) if self.static or a != self.sample_axis)

    def as_static(self) -> "ArrayGeometry":
        """This array as a static field (orography, a land-sea mask): the whole array (its
        region, when cropped: one range per axis of the array) in every row of every batch,
        read once a pass. It has no sample axis: no window, no samples of its own; a dataset
        needs one sampled variable beside it. It may be a channel of a stack (`stacks`) beside
        sampled variables of its shape."""
        if self.offset:
            raise errors.InvalidArgument(
                f"array {self.path!r} is shifted by {self.offset}: a static field has no sample "
                "axis to shift along"
            )
        return replace(self, static=True, region=None)

    @property
    def inner_shape(self) -> tuple:
        """One sample's shape: the field axes' lengths (the region's, when cropped)."""
        if self.region is not None:
            return tuple(hi - lo for lo, hi in self.region)
        return tuple(self.shape[a] for a in self.field_axes)

    def shift(self, k: int) -> "ArrayGeometry":
        """The same array read `k` samples further along the sample axis."""
        if not isinstance(k, numbers.Integral) or isinstance(k, bool):
            raise TypeError(f"shift(k): k must be an int, not {type(k).__name__}")
        self._sampled("window to shift")
        return replace(self, offset=self.offset + int(k))

    def crop(self, *region, wrap: bool = False) -> "ArrayGeometry":
        """The same view restricted to a region of the field: one range per field axis, in
        physical order (the sample axis is not listed), each a `slice` with step 1 (`slice(None)`
        for the whole axis) or a `(start, end)` pair, half-open. Only the stored chunks the
        region touches are read, decoded and held, and a sample is the region: a regional model
        reads its region of a global archive, nothing more. Cropping again crops the array, not
        the earlier region.

        `wrap=True` is for periodic axes (longitude on a global grid): a range may then run
        across the end of its axis and on from its start, given as a negative start (counted
        from the end: `slice(-100, 180)` on a 1440-long axis is its last 100 and first 180
        elements, in that order) or as an end past the axis length (`(1340, 1620)`, the same
        range), no longer than the axis. `region` then holds such a range with its end past the
        axis length."""
        if not isinstance(wrap, bool):
            raise TypeError(f"crop of array {self.path!r}: wrap must be a bool, not {wrap!r}")
        axes = self.field_axes
        if len(region) != len(axes):
            which = ("(a static field: every axis of the array)" if self.static
                     else f"(the sample axis is {self.sample_axis})")
            raise errors.InvalidArgument(
                f"crop of array {self.path!r}: give one range per field axis, {len(axes)} for "
                f"axes {list(axes)} {which}, not {len(region)}"
            )
        out = []
        for a, r in zip(axes, region):
            n = self.shape[a]
            if isinstance(r, slice):
                if r.step not in (None, 1):
                    raise errors.InvalidArgument(
                        f"crop of array {self.path!r}: axis {a} has step {r.step}; a region "
                        "is contiguous (step 1)"
                    )
                lo, hi = r.start, r.stop
                lo = 0 if lo is None else lo
                hi = n if hi is None else hi
            elif isinstance(r, (tuple, list)) and len(r) == 2:
                lo, hi = r
            else:
                raise TypeError(
                    f"crop of array {self.path!r}: axis {a} takes a slice or a (start, end) "
                    f"pair, not {r!r}"
                )
            for v in (lo, hi):
                if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                    raise TypeError(
                        f"crop of array {self.path!r}: axis {a}'s bounds must be ints, not {v!r}"
                    )
            lo, hi = int(lo), int(hi)
            if wrap:
                if not (-n <= lo < n and lo < hi <= lo + n):
                    raise errors.InvalidArgument(
                        f"crop of array {self.path!r}: axis {a} has length {n}; a wrapping "
                        f"range [{lo}, {hi}) must satisfy -{n} <= start < {n} and "
                        f"start < end <= start + {n}"
                    )
                # Normal form: 0 <= start < n, the end past n only when the range wraps.
                lo, hi = lo % n, lo % n + (hi - lo)
            elif not 0 <= lo < hi <= n:
                hint = (
                    "; a range across the end of a periodic axis (longitude) needs wrap=True"
                    if lo < 0 or hi > n
                    else ""
                )
                raise errors.InvalidArgument(
                    f"crop of array {self.path!r}: axis {a} has length {n}; the range "
                    f"[{lo}, {hi}) must satisfy 0 <= start < end <= {n}{hint}"
                )
            out.append((lo, hi))
        whole = all(lo == 0 and hi == self.shape[a] for a, (lo, hi) in zip(axes, out))
        return replace(self, region=None if whole else tuple(out))

    def crop_coords(self, bounds: Mapping[str, Any] | None = None, *,
                    periodic: Mapping[str, float] | None = None,
                    **dims: Any) -> "ArrayGeometry":
        """`crop` with the region given in coordinate values: `g.crop_coords(latitude=(72, 35),
        longitude=(-25, 45), periodic={"longitude": 360})` (or the same ranges as a `bounds`
        dict). Each named dimension's 1-D coordinate array (the array of that name beside this
        one, as xarray writes them) is read, and its range becomes the run of indices whose
        values lie between its two ends, both included; axes not named stay whole. A periodic
        dimension's range runs upward from its first end to its second, across the seam of
        the axis if it must (then the crop wraps). See `coordinate_region`."""
        ranges = dict(bounds or {})
        for dim in dims:
            if dim in ranges:
                raise TypeError(f"crop_coords: {dim!r} is given twice")
        ranges.update(dims)
        region, wrap = coordinate_region(self.store, self.path, ranges, periodic=periodic,
                                         sample_axis=self.sample_axis,
                                         storage_options=self.storage_options)
        return self.crop(*region, wrap=wrap)

    @property
    def wraps(self) -> bool:
        """True when a range of the region runs across the end of its axis (`crop(...,
        wrap=True)`)."""
        return self.region is not None and any(
            hi > self.shape[a] for a, (_, hi) in zip(self.field_axes, self.region)
        )


def coordinate_region(
    store,
    array: str,
    bounds: Mapping[str, Any],
    *,
    periodic: Mapping[str, float] | None = None,
    sample_axis: int = 0,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[tuple[tuple[int, int], ...], bool]:
    """The field region of `array` that coordinate ranges describe: `bounds` maps dimension
    names to `(end, end)` pairs of coordinate values, `periodic` dimension names to their
    period (360 for longitude in degrees). Returns one `(start, end)` index range per field
    axis in physical order (the whole axis where no bounds were given) and whether a range
    runs across the end of its axis: what `ArrayGeometry.crop(*region, wrap=wrap)` takes.
    Raises `InvalidArgument` naming the dimension when it is not one of the array's field
    dimensions, has no coordinate array, or no coordinate lies in its range."""
    if not isinstance(array, str):
        raise TypeError(f"array must be a str, not {type(array).__name__}")
    _check_int("sample_axis", sample_axis, minimum=0)
    if not isinstance(bounds, Mapping) or not bounds:
        raise TypeError("bounds must be a non-empty dict of dimension name -> (end, end)")
    ranges: dict[str, list[float]] = {}
    for dim, r in bounds.items():
        pair = tuple(r) if isinstance(r, (tuple, list)) else None
        if not isinstance(dim, str) or pair is None or len(pair) != 2 or not all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) for v in pair):
            raise TypeError(f"bounds[{dim!r}] must be a pair of numbers, not {r!r}")
        ranges[dim] = [float(pair[0]), float(pair[1])]
    periods: dict[str, float] = {}
    for dim, p in dict(periodic or {}).items():
        if not isinstance(p, numbers.Real) or isinstance(p, bool):
            raise TypeError(f"periodic[{dim!r}] must be a number (360 for degrees), not {p!r}")
        periods[dim] = float(p)
    options = None if storage_options is None else _storage_options(storage_options)
    params = {"array": array, "bounds": ranges, "periodic": periods,
              "sample_axis": sample_axis, "storage_options": options or {}}
    out = _call_interruptible(
        lib.isb_coordinate_region, _path(store), json.dumps(params).encode(),
        free=lib.isb_string_free,
    )
    raw = json.loads(_take_string(out))
    return tuple((int(lo), int(hi)) for lo, hi in raw["region"]), bool(raw["wrap"])


# CF time units (`"hours since 1900-01-01"`) and the numpy unit of each.
_CF_UNITS = {
    "days": "D", "day": "D", "d": "D",
    "hours": "h", "hour": "h", "hr": "h", "h": "h",
    "minutes": "m", "minute": "m", "min": "m",
    "seconds": "s", "second": "s", "sec": "s", "s": "s",
    "milliseconds": "ms", "millisecond": "ms", "ms": "ms",
    "microseconds": "us", "microsecond": "us", "us": "us",
    "nanoseconds": "ns", "nanosecond": "ns", "ns": "ns",
}
# Calendars that are numpy's proleptic Gregorian for every date a dataset holds after 1582.
_CF_GREGORIAN = {"standard", "gregorian", "proleptic_gregorian"}


_CF_DATE = re.compile(
    r"(-?\d+)-(\d{1,2})(?:-(\d{1,2}))?"            # year-month[-day], digits not padded
    r"(?:[ T]+(\d{1,2}):(\d{1,2})(?::(\d{1,2}(?:\.\d*)?))?)?"  # [hour:minute[:second]]
    r"\s*(?:Z|UTC|[+-]00:?00)?"                     # UTC only
)


def _cf_reference(since: str) -> np.datetime64 | None:
    """The reference date of CF time units (`1900-01-01 00:00:00.0`, `1850-1-1`,
    `2000-01-01T00:00:00Z`) as datetime64, or None when it is not one (another time zone)."""
    m = _CF_DATE.fullmatch(since.strip())
    if m is None:
        return None
    year, month, day, hour, minute, second = m.groups()
    try:
        # Seconds (or microseconds for a fractional second) reach any year a dataset holds;
        # nanoseconds would end in 2262.
        date = np.datetime64(f"{int(year):04d}-{int(month):02d}-{int(day or 1):02d}", "s")
    except ValueError:
        return None
    seconds = int(hour or 0) * 3600 + int(minute or 0) * 60 + float(second or 0)
    if seconds == int(seconds):
        return date + np.timedelta64(int(seconds), "s")
    return date + np.timedelta64(round(seconds * 1e6), "us")


def _ticks(step: str, fine: str) -> int:
    """How many `fine` units (numpy's: "ns", "us", "s") one `step` holds."""
    return int(np.ones(1, dtype=f"timedelta64[{step}]").astype(f"timedelta64[{fine}]").astype(np.int64)[0])


def _cf_times(values: np.ndarray, attributes: Mapping[str, Any], path: str) -> np.ndarray | None:
    """`values` as datetime64 when `attributes` give CF time units ("<unit> since <date>") in a
    Gregorian calendar; None when they give no time units; `Unsupported` for time units numpy
    cannot decode exactly (another calendar, a date it cannot read)."""
    units = attributes.get("units")
    if not isinstance(units, str) or " since " not in units:
        return None
    unit, since = (part.strip() for part in units.split(" since ", 1))
    calendar = str(attributes.get("calendar", "standard")).lower()
    step = _CF_UNITS.get(unit.lower())
    if step is None or calendar not in _CF_GREGORIAN:
        raise errors.Unsupported(
            f"coordinate {path!r} has units {units!r} and calendar {calendar!r}, which are not "
            "a time in numpy's Gregorian calendar: pass decode_times=False for the stored numbers"
        )
    origin = _cf_reference(since)
    if origin is None:
        raise errors.Unsupported(
            f"coordinate {path!r}: cannot read the reference date of units {units!r} (a time "
            "zone other than UTC?): pass decode_times=False for the stored numbers"
        )
    floats = values.astype(np.float64)
    missing = ~np.isfinite(floats)
    seconds_per_step = _ticks(step, "ns") / 1e9
    epoch_seconds = origin.astype("datetime64[s]").astype(np.int64) + floats[~missing] * seconds_per_step
    # numpy adds times without checking: past what microseconds in 64 bits hold (292,000 years
    # from 1970) a date would wrap into a wrong one.
    # (Unsigned times past int64 would wrap on the way too: shown exactly.)
    past = np.abs(epoch_seconds) >= 9.2e12
    past_int64 = values.dtype.kind == "u" and values.size and values.max() > np.iinfo(np.int64).max
    if past_int64 or np.any(past):
        shown = str(values.max()) if past_int64 else f"{floats[~missing][np.argmax(past)]:g}"
        raise errors.BadData(
            f"coordinate {path!r} holds {shown} {unit} since {since}, past any date numpy can "
            "hold: pass decode_times=False for the stored numbers"
        )
    within_ns = bool(np.all(np.abs(epoch_seconds) < 9.2e9))
    if values.dtype.kind in "iu" and (step != "ns" or within_ns):
        return origin + values.astype(np.int64).astype(f"timedelta64[{step}]")
    # Fractional steps (and nanoseconds past 2262): to the nanosecond where that reaches (1678
    # to 2262, as xarray), else to the microsecond (NaN becomes NaT).
    fine = "ns" if within_ns else "us"
    per_step = _ticks(step, "ns") / _ticks(fine, "ns")
    ticks = np.round(np.where(missing, 0, floats) * per_step)
    out = origin.astype(f"datetime64[{fine}]") + ticks.astype(f"timedelta64[{fine}]")
    out[missing] = np.datetime64("NaT")
    return out


def coordinate_values(
    store,
    array: str,
    dimension: str | None = None,
    *,
    sample_axis: int = 0,
    decode_times: bool = True,
    storage_options: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """The values of `array`'s coordinate along `dimension` (default: the sample axis's
    dimension, `time` for an ERA5-like variable): the 1-D array of that name beside `array`, one
    value per index, so `coordinate_values(store, "t2m")[batch.read_indices("x")]` is each
    row's time. With `decode_times` (default), a coordinate whose `units` are CF time units
    (`"hours since 1900-01-01"`) in a Gregorian calendar comes back as numpy datetime64, as
    xarray decodes it (integers exactly, to the second or to their unit when finer; fractional
    steps to the nanosecond between 1678 and 2262, as xarray, else to the microsecond); other units or calendars raise `Unsupported`, and `decode_times=False`
    gives the stored numbers. Raises `InvalidArgument` naming the dimension when the array has
    no dimension names, no such dimension, or no coordinate array for it."""
    if not isinstance(array, str):
        raise TypeError(f"array must be a str, not {type(array).__name__}")
    if dimension is not None and not isinstance(dimension, str):
        raise TypeError(f"dimension must be a str or None, not {type(dimension).__name__}")
    if not isinstance(decode_times, bool):
        raise TypeError(f"decode_times must be a bool, not {type(decode_times).__name__}")
    params: dict[str, Any] = {"array": array, "sample_axis": _check_int("sample_axis", sample_axis, 0)}
    if dimension is not None:
        params["dimension"] = dimension
    if storage_options is not None:
        params["storage_options"] = _storage_options(storage_options)
    out = _call_interruptible(
        lib.isb_coordinate_values, _path(store), json.dumps(params).encode(),
        free=lib.isb_string_free,
    )
    raw = json.loads(_take_string(out))
    dtype = np.dtype(_DTYPES[raw["dtype"]])
    if dtype.kind == "f":
        values = np.array([np.nan if v is None else v for v in raw["values"]], dtype=dtype)
    else:
        values = np.array(raw["values"], dtype=dtype)
    if decode_times:
        times = _cf_times(values, raw["attributes"], raw["path"])
        if times is not None:
            return times
    return values


def open_geometries(
    store,
    variables: Sequence[str] | None = None,
    sample_axis: int = 0,
    storage_options: Mapping[str, Any] | None = None,
) -> dict:
    """Geometries of a store's data variables (coordinates and 0-D arrays skipped), by path.
    `storage_options` configure an object-store URL (as for `InSituDataset`) and are kept in
    each geometry."""
    _check_int("sample_axis", sample_axis, minimum=0)
    if isinstance(variables, str):  # one name, not its characters
        variables = [variables]
    options = None if storage_options is None else _storage_options(storage_options)
    params = {"sample_axis": sample_axis, "storage_options": options or {}}
    out = _call_interruptible(
        lib.isb_open_geometries_with, _path(store), json.dumps(params).encode(),
        free=lib.isb_string_free,
    )
    raw = json.loads(_take_string(out))
    geometries = {
        p: ArrayGeometry(
            store=_store_str(store),
            path=p,
            shape=tuple(g["shape"]),
            chunks=tuple(g["chunks"]),
            dtype=g["dtype"],
            sample_axis=g["sample_axis"],
            storage_options=options,
        )
        for p, g in raw.items()
    }
    if variables is None:
        return geometries
    missing = [v for v in variables if v not in geometries]
    if missing:
        raise errors.InvalidArgument(
            f"variables {missing} are not data variables of {store}; it has {sorted(geometries)}"
        )
    return {v: geometries[v] for v in variables}


@dataclass
class SplitManifest:
    """Which sample-axis chunks belong to each split (whole chunks only)."""

    data: dict = field(repr=False)

    @property
    def splits(self) -> dict:
        return self.data["splits"]

    @property
    def array(self) -> str:
        return self.data["array"]

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """The sample range each split was drawn from, for a manifest made by `split_by_ranges`
        (dates resolved to sample indices); empty for one made from fractions."""
        return {k: (int(a), int(b)) for k, (a, b) in self.data.get("ranges", {}).items()}

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "SplitManifest":
        """A manifest from `to_json` text. Its shape is checked here; whether it fits an array
        is checked by the dataset it is given to."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise errors.InvalidArgument(f"not a split manifest: not JSON ({e})") from None
        if not isinstance(data, dict) or not isinstance(data.get("splits"), dict):
            raise errors.InvalidArgument("not a split manifest: no `splits` object")
        for name, chunks in data["splits"].items():
            if not isinstance(chunks, list) or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in chunks
            ):
                raise errors.InvalidArgument(
                    f"not a split manifest: split `{name}` must list chunk indices (integers >= 0)"
                )
        if not isinstance(data.get("array"), str):
            raise errors.InvalidArgument("not a split manifest: no `array` name")
        return cls(data)


def split_by_chunk(
    geom: ArrayGeometry,
    fractions=(0.8, 0.1, 0.1),
    seed: int = 0,
    contiguous: bool = True,
    sample_range=None,
) -> SplitManifest:
    """Assigns whole chunks of `geom`'s sample axis to train/val/test by `fractions` (of chunks),
    of the chunks that overlap `sample_range` (`(start, stop)` or a `range` such as a dataset's
    `anchor_range`) when given."""
    if not isinstance(geom, ArrayGeometry):
        raise TypeError(f"split_by_chunk: geom must be an ArrayGeometry, not {type(geom).__name__}")
    fractions = [float(f) for f in fractions]
    if not all(math.isfinite(f) for f in fractions):
        raise errors.InvalidArgument(
            f"invalid argument `fractions` = {fractions}: every fraction must be a finite number"
        )
    params = {
        "fractions": fractions,
        "seed": _check_int("seed", seed, minimum=0),
        "contiguous": bool(contiguous),
        "sample_axis": geom.sample_axis,
    }
    if sample_range is not None:
        if isinstance(sample_range, range):
            if sample_range.step != 1:
                raise errors.InvalidArgument(
                    f"invalid argument `sample_range` = {sample_range}: a range of step 1"
                )
            sample_range = (sample_range.start, sample_range.stop)
        start, stop = sample_range
        params["sample_range"] = [_check_int("sample_range", start, 0), _check_int("sample_range", stop, 0)]
    return _split(geom, params)


def _split(geom: ArrayGeometry, params: dict) -> SplitManifest:
    """`isb_split_by_chunk` over `geom`'s array with `params`, reopening its store with the
    options it carries."""
    geom._sampled("chunks along a sample axis to split")
    if geom.storage_options:
        params["storage_options"] = _storage_options(geom.storage_options)
    raw = _json_call(
        lib.isb_split_by_chunk,
        _path(geom.store),
        geom.path.encode(),
        json.dumps(params).encode(),
    )
    return SplitManifest(raw)


class Statistics(NamedTuple):
    """What `InSituDataset.statistics` gives for one batch array: with an `axis`, numpy arrays
    with one value per index along it; without, scalars. `std` is the population standard
    deviation (numpy's `ddof=0`); NaN values are left out and counted in `nan_count`, and an
    index with no other value has NaN statistics. With `quantiles` asked for, `quantiles` is
    their probabilities and `quantile_values` the values at them (numpy's default
    `np.quantile`, within 1/256 of the value; the least and greatest exact): shaped
    `(indices, quantiles)` with an axis, `(quantiles,)` without; both None otherwise."""

    axis: int | None
    count: Any
    nan_count: Any
    mean: Any
    std: Any
    min: Any
    max: Any
    quantiles: Any = None
    quantile_values: Any = None

    @classmethod
    def _from_json(cls, v: dict) -> "Statistics":
        def floats(xs):
            out = np.array([np.nan if x is None else x for x in xs], dtype=np.float64)
            return out if v["axis"] is not None else float(out[0])

        def ints(xs):
            out = np.array(xs, dtype=np.int64)
            return out if v["axis"] is not None else int(out[0])

        qs = values = None
        if v.get("quantiles") is not None:
            qs = np.array(v["quantiles"], dtype=np.float64)
            values = np.array([[np.nan if x is None else x for x in row]
                               for row in v["quantile_values"]], dtype=np.float64)
            values = values.reshape(-1, len(qs))
            if v["axis"] is None:
                values = values[0]
        return cls(v["axis"], ints(v["count"]), ints(v["nan_count"]), floats(v["mean"]),
                   floats(v["std"]), floats(v["min"]), floats(v["max"]), qs, values)

    def to_json(self) -> str:
        """The statistics as JSON text, as the library writes them (lists of one value per
        index, NaN as null): to keep beside a model the normalisation it was trained with."""

        def listed(v, cast):
            return [None if cast is float and np.isnan(x) else cast(x) for x in np.atleast_1d(v)]

        out = {
            "axis": self.axis,
            "count": listed(self.count, int), "nan_count": listed(self.nan_count, int),
            "mean": listed(self.mean, float), "std": listed(self.std, float),
            "min": listed(self.min, float), "max": listed(self.max, float),
        }
        if self.quantiles is not None:
            out["quantiles"] = listed(self.quantiles, float)
            out["quantile_values"] = [listed(row, float)
                                      for row in np.atleast_2d(self.quantile_values)]
        return json.dumps(out)

    @classmethod
    def from_json(cls, text: str) -> "Statistics":
        """Statistics from `to_json` text (or one array's entry of the library's JSON)."""
        try:
            return cls._from_json(json.loads(text))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise errors.InvalidArgument(f"not statistics JSON: {e}") from None

    def standardize(self, paths: Sequence[str] | None = None):
        """A `transforms.Standardize` with these statistics (per index along the same axis),
        restricted to the arrays at `paths` when given (`applies`). An index whose spread is
        zero or unknown cannot be standardized, and raises `InvalidArgument`."""
        std = np.atleast_1d(self.std)
        if not np.all(np.isfinite(std) & (std > 0)):
            raise errors.InvalidArgument(
                f"invalid argument `std` = {self.std}: standardizing needs a positive, finite "
                "spread at every index (a constant or empty index has none)"
            )
        if self.axis is None:
            t = _transforms.Standardize(float(self.mean), float(self.std))
        else:
            t = _transforms.Standardize([float(x) for x in self.mean], [float(x) for x in std],
                                        axis=self.axis)
        return t if paths is None else _transforms.applies(list(paths), t)


def split_by_ranges(geom: ArrayGeometry, ranges: Mapping, snap: str = "exact") -> SplitManifest:
    """Gives each split the whole chunks of `geom`'s sample axis in its half-open range:
    `ranges` maps `train`, `val`, `test` (any of them) to `(start, stop)`, each end a sample
    index or a date on the array's time coordinate (`"2016-01-01"`, `"2016-01-01T06:00"`, a
    `numpy.datetime64`, a `datetime.datetime` or `datetime.date`, UTC, to the second), which
    stands for the first sample at or after it. `snap` says what a bound inside a chunk does:
    `"exact"` raises (naming the chunk boundaries around it), `"inward"` leaves that chunk out
    of the split, `"outward"` takes it in (and raises if two splits would share it)."""
    if not isinstance(geom, ArrayGeometry):
        raise TypeError(f"split_by_ranges: geom must be an ArrayGeometry, not {type(geom).__name__}")
    if not isinstance(ranges, Mapping):
        raise TypeError(
            "`ranges` must map split names to (start, stop), such as "
            f"{{'train': (0, 8760)}}, not {type(ranges).__name__}"
        )
    if snap not in ("exact", "inward", "outward"):
        raise errors.InvalidArgument(
            f"invalid argument `snap` = {snap!r}: use 'exact', 'inward' or 'outward'"
        )
    given: dict[str, list] = {}
    for name, bounds in ranges.items():
        if not isinstance(name, str):
            raise TypeError(f"`ranges` keys are split names (str), not {type(name).__name__}")
        try:
            start, stop = bounds
        except (TypeError, ValueError):
            raise TypeError(
                f"`ranges[{name!r}]` must be (start, stop), not {bounds!r}"
            ) from None
        given[name] = [_range_bound(name, start), _range_bound(name, stop)]
    params: dict[str, Any] = {"ranges": given, "snap": snap, "sample_axis": geom.sample_axis}
    return _split(geom, params)


def _range_bound(name: str, value) -> int | str:
    """One end of a split's range as the library takes it: a sample index, or a date as text."""
    import datetime

    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return _check_int(f"ranges[{name!r}]", value, minimum=0)
    if isinstance(value, str):
        return value
    if isinstance(value, (np.datetime64, datetime.date)):
        t = np.datetime64(value)
        if np.isnat(t):
            raise errors.InvalidArgument(f"invalid argument `ranges[{name!r}]`: NaT is not a date")
        seconds = t.astype("datetime64[s]")
        if seconds != t:
            raise errors.InvalidArgument(
                f"invalid argument `ranges[{name!r}]` = {t}: dates are taken to the second"
            )
        return str(seconds)
    raise TypeError(
        f"`ranges[{name!r}]` ends are sample indices (int) or dates (str, numpy.datetime64, "
        f"datetime), not {type(value).__name__}"
    )


def _stacks(stacks) -> dict[str, list[str]]:
    """`stacks` as the config takes it, or a TypeError saying what it takes."""
    what = "`stacks` must map each stacked array's name to a list of labels, such as {'x': ['t2m', 'u10']}"
    if not isinstance(stacks, Mapping):
        raise TypeError(f"{what}, not {type(stacks).__name__}")
    out: dict[str, list[str]] = {}
    for name, labels in stacks.items():
        if not isinstance(name, str) or isinstance(labels, str) or not isinstance(labels, Iterable):
            raise TypeError(f"{what}; got {name!r}: {labels!r}")
        labels = list(labels)
        if not all(isinstance(l, str) for l in labels):
            raise TypeError(f"{what}; got {name!r}: {labels!r}")
        out[name] = labels
    return out


def _mounts(mounts) -> dict[str, tuple[str, dict[str, Any] | None, Any]]:
    """`mounts` as (location, storage options, alignment) by name, or a TypeError saying what it
    takes."""
    what = ("`mounts` must map each mount's name to a store (a path or URL), to (store, "
            "storage_options), or to {'store': ..., 'storage_options': {...}, 'align': 'time', "
            "{'containing': 'time'}, {'nearest': 'time'} or an int}, such as "
            "{'targets': '/data/targets.zarr'}")
    if not isinstance(mounts, Mapping):
        raise TypeError(f"{what}, not {type(mounts).__name__}")
    out: dict[str, tuple[str, dict[str, Any] | None, Any]] = {}
    for name, value in mounts.items():
        if not isinstance(name, str):
            raise TypeError(f"{what}; got the name {name!r}")
        align = None
        if isinstance(value, Mapping):
            unknown = set(value) - {"store", "storage_options", "align"}
            if unknown or "store" not in value:
                raise TypeError(f"{what}; got {name!r}: {dict(value)!r}")
            location, options, align = (value["store"], value.get("storage_options"),
                                        value.get("align"))
            if isinstance(align, Mapping):
                how, dim = next(iter(align.items())) if len(align) == 1 else (None, None)
                good = how in ("containing", "nearest") and isinstance(dim, str) and dim != ""
                if good:
                    align = {how: dim}
            else:
                good = align is None or (isinstance(align, (str, numbers.Integral))
                                         and not isinstance(align, bool) and align != "")
            if not good:
                raise TypeError(f"{what}; the `align` of {name!r} is {align!r}: the name of a "
                                "coordinate both stores have, {'containing': that name}, "
                                "{'nearest': that name}, or the sample of this dataset's store "
                                "where the mounted one starts")
            if isinstance(align, numbers.Integral):
                align = int(align)
        elif isinstance(value, tuple) and len(value) == 2:
            location, options = value
        else:
            location, options = value, None
        if not isinstance(location, (str, bytes, os.PathLike)):
            raise TypeError(f"{what}; got {name!r}: {value!r}")
        out[name] = (_store_str(location),
                     None if options is None else _storage_options(options), align)
    return out


def _indexes(indexes, views: list | None) -> dict[str, np.ndarray]:
    """`indexes` as int64 arrays by label, each added to its view of `views` (the config's
    variables); a TypeError or InvalidArgument saying what it takes."""
    if indexes is None:
        return {}
    if not isinstance(indexes, Mapping):
        raise TypeError(f"`indexes` must map labels to sequences of sample indices, not "
                        f"{type(indexes).__name__}")
    by_label = {v["label"]: v for v in views or []}
    out = {}
    for label, index in indexes.items():
        if label not in by_label:
            raise errors.InvalidArgument(
                f"invalid argument `indexes` = {label!r}: not a label of `geometries` "
                f"({list(by_label)}); an index belongs to one of the dataset's variables"
            )
        array = np.asarray(index)
        if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
            raise TypeError(f"indexes[{label!r}] must be a 1-D sequence of ints, not "
                            f"{array.dtype} of shape {array.shape}")
        if array.size and array.min() < 0:
            raise errors.InvalidArgument(
                f"invalid argument `indexes` = {label!r}: entry {int(array.argmin())} is "
                f"{int(array.min())}; sample indices are at least 0"
            )
        out[label] = array.astype(np.int64)
        by_label[label]["index"] = out[label].tolist()
    return out


def _same_store(a: str, b: str) -> bool:
    """Whether two store locations name one store: URLs compared as text (a trailing `/` aside),
    local paths after resolving links and `..`."""
    a, b = (x.removeprefix("file://") for x in (a, b))
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _check_int(name: str, value, minimum: int = 1) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be an int, not {type(value).__name__}")
    value = int(value)
    if value < minimum:
        raise errors.InvalidArgument(f"invalid argument `{name}` = {value}: must be at least {minimum}")
    if value >= 2**64:  # the library takes 64-bit integers
        raise errors.InvalidArgument(f"invalid argument `{name}` = {value}: must be below 2**64")
    return value


class _Export:
    """Owns one exported DLPack tensor and presents it to numpy through `__array_interface__`;
    the numpy array's base is this object, so the deleter runs when the last array, view or
    tensor made from this memory is collected."""

    __slots__ = ("tensor", "__array_interface__", "__weakref__")

    def __init__(self, tensor: int, data: int, shape: tuple, typestr: str):
        self.tensor = tensor
        self.__array_interface__ = {
            "version": 3,
            "shape": shape,
            "typestr": typestr,
            "data": (data, False),
        }

    def __del__(self):
        tensor, self.tensor = self.tensor, None
        if tensor:
            try:
                lib.isb_dlpack_delete(tensor)
            except Exception:  # interpreter shutdown: the process is ending anyway
                pass


class EpochOrder(NamedTuple):
    """The order one epoch of a split draws (`InSituDataset.order`): `sample_indices`, every
    sample the epoch yields in the order the batches emit them (int64, the concatenation of the
    batches' `sample_indices`), and `block_ends`, the shuffle blocks as the index into
    `sample_indices` where each ends (int64, ascending, the last one `len(sample_indices)`)."""

    sample_indices: np.ndarray
    block_ends: np.ndarray

    def blocks(self) -> list[np.ndarray]:
        """The sample indices of each shuffle block, in order."""
        return np.split(self.sample_indices, self.block_ends[:-1])


class Batch:
    """One batch: `arrays[label]` shaped (batch, *sample_inner), aliasing Rust memory (and
    `arrays[name]` shaped (batch, channels, *sample_inner) for each of the dataset's `stacks`,
    in place of its labels' arrays);
    `sample_indices`, the anchor of each row; `epoch`, the epoch it was drawn in (what a
    per-sample random augmentation keys on with the sample index, `insitubatch.augment`);
    `index`, its place in that whole epoch, also when the epoch was resumed with `from_batch`
    (a checkpoint that saves `(epoch, index + 1)` resumes right after it); `patch_origins`,
    for a dataset with a `patch`, where each row's patch was cut: shaped (batch, patched
    axes), the same for every label of the row (None without a patch)."""

    def __init__(self, arrays: dict, sample_indices: np.ndarray, offsets: Mapping[str, int],
                 epoch: int = 0, index: int = 0,
                 placements: Mapping[str, tuple[int, int, int]] | None = None,
                 indexes: Mapping[str, np.ndarray] | None = None,
                 patch_origins: np.ndarray | None = None):
        self.arrays = arrays
        self.sample_indices = sample_indices
        self.patch_origins = patch_origins
        self._offsets = dict(offsets)
        # (mul, add, div) of the labels read from a store mounted with an alignment.
        self._placements = dict(placements or {})
        # The sample each anchor reads, for indexed labels.
        self._indexes = dict(indexes or {})
        self.epoch = epoch
        self.index = index

    def __len__(self) -> int:
        return len(self.sample_indices)

    def __repr__(self) -> str:
        shapes = {k: v.shape for k, v in self.arrays.items()}
        return f"Batch(epoch={self.epoch}, index={self.index}, len={len(self)}, arrays={shapes})"

    def read_indices(self, label: str) -> np.ndarray:
        """The sample index `label` read for each row, in its own array: anchor + the label's
        offset; for a store mounted with an alignment, that store's sample at the anchor's
        time, `(anchor * mul + add) // div`, then the offset; for an indexed label, its
        index's entry for the anchor."""
        if label not in self._offsets:
            raise KeyError(f"no label {label!r}; the batch has {list(self._offsets)}")
        if label in self._indexes:
            return self._indexes[label][self.sample_indices]
        at = self.sample_indices
        if label in self._placements:
            mul, add, div = (np.int64(x) for x in self._placements[label])
            at = (at * mul + add) // div
        return at + np.int64(self._offsets[label])

    @property
    def offsets(self) -> dict:
        return dict(self._offsets)

    def stack(self, labels: Sequence[str] | None = None, axis: int = 1) -> np.ndarray:
        """The arrays of `labels` (default: all) stacked along a new `axis` (a copy; the
        dataset's `stacks` argument has the library write channels in place instead)."""
        labels = list(self.arrays) if labels is None else list(labels)
        missing = [l for l in labels if l not in self.arrays]
        if missing:
            raise KeyError(f"no label(s) {missing}; the batch has {list(self.arrays)}")
        return np.stack([self.arrays[l] for l in labels], axis=axis)


_DTYPES = {
    "bool": "|b1", "int8": "|i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "uint8": "|u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
    "float16": "<f2", "float32": "<f4", "float64": "<f8",
    "complex64": "<c8", "complex128": "<c16",
}


class _BatchReader:
    """Turns batch handles into `Batch`es. The labels, inner shapes and dtypes are fixed per
    dataset, and the out-parameters are reused, so a batch costs one C call per label plus four
    and no ctypes structure traversal."""

    def __init__(self, formats: Mapping[str, tuple], offsets: Mapping[str, int],
                 placements: Mapping[str, tuple[int, int, int]],
                 indexes: Mapping[str, np.ndarray], patch: tuple[int, ...] | None = None):
        # The patched axes per row (0: rows hold whole samples).
        self.patch_axes = len(patch) if patch else 0
        self.labels = [
            (label, label.encode(), tuple(shape), dtype.str)
            for label, (shape, dtype) in formats.items()
        ]
        self.offsets = dict(offsets)
        self.placements = dict(placements)
        self.indexes = dict(indexes)
        self.err = ctypes.c_void_p()
        self.tensor = ctypes.c_void_p()
        self.idx = ctypes.c_void_p()
        self.len = ctypes.c_size_t()
        self.epoch = ctypes.c_uint64()
        self.index = ctypes.c_uint64()
        self.err_ref = ctypes.byref(self.err)
        self.position_refs = (ctypes.byref(self.epoch), ctypes.byref(self.index))
        self.tensor_ref = ctypes.byref(self.tensor)
        self.idx_ref = ctypes.byref(self.idx)
        self.len_ref = ctypes.byref(self.len)

    def read(self, handle: ctypes.c_void_p) -> Batch:
        try:
            _check(lib.isb_batch_position(handle, *self.position_refs, self.err_ref), self.err)
            _check(lib.isb_batch_sample_indices(handle, self.idx_ref, self.len_ref, self.err_ref), self.err)
            n = self.len.value
            raw = ctypes.string_at(_address(self.idx, "sample index array"), n * 8) if n else b""
            sample_indices = np.frombuffer(raw, dtype=np.uint64).astype(np.int64)
            origins = None
            if self.patch_axes:
                _check(lib.isb_batch_patch_origins(handle, self.idx_ref, self.len_ref, self.err_ref),
                       self.err)
                k = self.patch_axes
                raw = ctypes.string_at(_address(self.idx, "patch origins"), n * k * 8) if n else b""
                origins = np.frombuffer(raw, dtype=np.uint64).astype(np.int64).reshape(n, k)
            arrays = {}
            for label, raw_label, inner, typestr in self.labels:
                _check(lib.isb_batch_export(handle, raw_label, self.tensor_ref, self.err_ref), self.err)
                tensor = _address(self.tensor, "tensor")
                data = ctypes.c_size_t.from_address(tensor + DATA_OFFSET).value
                arrays[label] = np.asarray(_Export(tensor, data, (n,) + inner, typestr))
        finally:
            lib.isb_batch_free(handle)
        return Batch(arrays, sample_indices, self.offsets, self.epoch.value, self.index.value,
                     self.placements, self.indexes, origins)


class _Epoch:
    """One epoch's iterator. Breaking out of the loop (or dropping it) stops the epoch and frees
    what it held; after an error, `next` raises `Cancelled` naming the first error."""

    def __init__(self, ds: "InSituDataset", it: ctypes.c_void_p, n_batches: int,
                 on_handle: Callable[[ctypes.c_void_p], None] | None = None):
        self._ds = ds
        # Given, each batch goes to it as a handle (then freed) instead of becoming a `Batch`:
        # `next` returns None. For the library's own reductions (`InSituDataset.statistics`).
        self._on_handle = on_handle
        self._it: ctypes.c_void_p | None = it
        self._len = n_batches
        self._reader = _BatchReader(ds.array_formats, ds._offsets, ds._placements, ds._indexes,
                                    ds.patch)
        self._b = ctypes.c_void_p()
        self._err = ctypes.c_void_p()
        self._refs = (ctypes.byref(self._b), ctypes.byref(self._err))
        self._failed: str | None = None
        # Held while a thread advances the epoch (`_owner` names it). `close` sets `_closing`,
        # which the wait checks between slices; from another thread it then takes the lock and
        # frees the epoch, from inside the owner's `next` (a signal handler) it leaves that to
        # `next`. Reentrant, so that a handler running before `_owner` is set cannot deadlock.
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._closing = False

    def __iter__(self) -> "_Epoch":
        return self

    def __len__(self) -> int:
        """Batches this iterator yields in all: the epoch's, or from `start_batch` on when
        resumed (`len(view) - start_batch`)."""
        return self._len

    def __next__(self) -> Batch:
        if not self._lock.acquire(blocking=False):
            if not self._closing:
                raise errors.InvalidArgument(
                    "this epoch's iterator is being advanced by another thread; "
                    "iterate one epoch from one thread at a time"
                )
            # Another thread is closing the epoch: once it has, the epoch is over.
            self._lock.acquire()
        self._owner = threading.get_ident()
        try:
            return self._next()
        finally:
            self._owner = None
            self._lock.release()

    def _next(self) -> Batch:
        if self._closing:  # closed from a signal handler during the previous next()
            self._close()
            raise StopIteration
        if self._failed is not None:
            raise errors.Cancelled(f"this iteration failed earlier and is over: {self._failed}")
        if self._it is None:
            raise StopIteration
        if self._ds._handle is None:
            self._close()
            raise errors.Closed("the dataset was closed during iteration")
        # A batch that arrived in a wait Ctrl-C interrupted is still in `_b`: deliver it first.
        if not self._b.value:
            try:
                # Waits in slices: between two, Python runs its signal handlers, so Ctrl-C raises
                # KeyboardInterrupt here while the batch is on its way, and the iteration stays
                # usable.
                status = _TIMED_OUT
                while status == _TIMED_OUT and not self._closing:
                    status = _check(
                        lib.isb_iter_next_timeout(self._it, _WAIT_SLICE_MS, *self._refs), self._err
                    )
            except errors.Error as e:
                self._failed = str(e)
                self._close()
                raise
            if self._closing:
                # Closed while it waited, by another thread or by a signal handler in this one
                # (closing frees a batch the wait received).
                self._close()
                raise errors.Closed("this epoch was closed while it waited")
            if status == _END_OF_EPOCH:
                self._close()
                raise StopIteration
        handle = ctypes.c_void_p(self._b.value)
        self._b.value = None
        if self._on_handle is not None:
            try:
                self._on_handle(handle)
            finally:
                lib.isb_batch_free(handle)
            return None  # type: ignore[return-value]
        batch = self._reader.read(handle)
        for t in self._ds._transforms:
            batch = t(batch)
        return batch

    def __reduce__(self):
        _not_picklable("an epoch's iterator")

    def close(self) -> None:
        """Stops the epoch early and frees what it held (idempotent). From another thread, it
        ends a `next()` that is waiting there (which raises `Closed`)."""
        self._closing = True
        if self._owner == threading.get_ident():
            return  # a signal handler inside this thread's next(): next() frees the epoch
        with self._lock:
            self._close()

    def _close(self) -> None:
        it, self._it = self._it, None
        if self._b.value:  # received by a wait that Ctrl-C interrupted, never delivered
            lib.isb_batch_free(self._b)
            self._b.value = None
        if it is not None:
            try:
                self._ds._last_stats = _json_call(lib.isb_iter_stats_json, it)
            except errors.Error:
                pass
            lib.isb_iter_free(it)
            for w in self._ds._last_stats.get("warnings", []):
                warnings.warn(w, errors.CacheWarning, stacklevel=2)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


def _not_picklable(what: str):
    """What pickling a dataset, a view or an epoch raises: they own this process's threads and
    memory, so another process (a DataLoader worker under `spawn` or `forkserver`, the default
    from Python 3.14) cannot be handed one."""
    raise TypeError(
        f"{what} cannot be sent to another process (pickle): it owns threads and memory of this "
        "one. With a torch DataLoader use num_workers=0 (insitubatch reads and decodes in "
        "parallel itself); elsewhere open a dataset in each process"
    )


class _View:
    """`ds.train` and friends: iterating starts an epoch over the split at the current epoch."""

    def __init__(self, ds: "InSituDataset", split: str):
        self._ds = ds
        self.split = split

    def __repr__(self) -> str:
        return f"<insitubatch view {self.split!r}>"

    def __reduce__(self):
        _not_picklable(f"the view ds.{self.split}")

    def __iter__(self) -> Iterator[Batch]:
        return self._ds._iterate(self.split)

    def from_batch(self, start_batch: int) -> Iterator[Batch]:
        """Resumes the current epoch at batch `start_batch`: the batches are `start_batch`
        onward of a whole epoch (the same samples in the same order, which depends on the seed
        and epoch only), and chunks only the earlier batches draw from are not read. For a job
        restarted mid-epoch from a checkpoint that saved the epoch and the batches done.
        `start_batch == len(view)` yields nothing; beyond it raises `InvalidArgument` naming
        `start_batch`."""
        return self._ds._iterate(self.split, _check_int("start_batch", start_batch, 0))

    def __len__(self) -> int:
        """Batches one epoch of the split yields (the last may be short); the same every epoch."""
        return self._ds._split_len(self.split)[1]

    @property
    def n_samples(self) -> int:
        """Samples one epoch of the split yields: every valid anchor once."""
        return self._ds._split_len(self.split)[0]


class InSituDataset:
    """Shuffled, split-aware batches from a Zarr store read in place.

    `geometries` maps labels to `ArrayGeometry` views (use `g.shift(h)` for a window); default:
    every data variable, labelled by its path. Views: `train` (shuffled when `shuffle`), `val`,
    `test`, `all` (sequential).

    Data-parallel training (one process per rank, as with torch DDP): pass `rank` and
    `world_size` (for example from the `RANK` and `WORLD_SIZE` environment variables torchrun
    sets), the same store, manifest and seed on every rank. Each rank reads its own share of
    every split — the same chunks every epoch, so its cache holds only that share — and `train`
    is cut to the shortest rank's length so every rank takes the same number of steps
    (`even_train=False` yields each rank's whole share instead); `val`, `test` and `all` yield
    every sample once across the ranks.

    `drop_last=True` leaves out each epoch's last batch when it would be short, so every batch
    has `batch_size` rows (static shapes for `torch.compile` or `jax.jit`); `len(view)` is then
    ⌊samples / batch_size⌋, and a split with fewer samples than one batch raises when iterated.
    A list of split names (`drop_last=["train"]`) does that for those splits only: train on
    full batches, validate on every sample.

    `fast_first_batch=True` starts each shuffled epoch with a block of one batch's chunks
    (⌈batch_size / samples per chunk⌉), each next block twice as large up to `block_chunks`, so
    the first batch waits for those chunks instead of a whole block; the epoch's first batches
    then mix fewer chunks. Sequential views are unchanged.

    `prefetch_next_epoch=True` starts the next epoch's train iteration in the background once
    the current one has loaded every chunk it reads: a loop that spends time on each batch (a
    model step), then calls `set_epoch(epoch + 1)` and iterates `train` again, gets its first
    batch at once (the order is unchanged). For a while two iterations run, counted against
    `memory_limit_bytes` like any second iteration; in the cache budget the early one takes
    over the epoch before's room as its last batches are taken. One that would not fit is not
    started, and one in the way of an iteration you ask for is dropped first (from then on
    that split's iterations start it once they have loaded their last chunk). Iterating train
    at another epoch, or resuming mid-epoch, drops it.

    `sample_stride=k` draws every k-th sample along the sample axis from `sample_phase` (below
    k), in every split: 6-hourly samples from hourly data with `sample_stride=6`, or 00 and 12
    UTC with `sample_stride=12` when the array's first sample is at 00 UTC. A window (`shift(h)`)
    reads `h` samples after each drawn one. Chunks are still read and decoded whole, once; a
    chunk with no sample on the stride is not read.

    `chunk_transforms` (built-ins from `insitubatch.transforms`, scoped with `applies`) run in
    the Rust decoder on every decoded chunk and are cached with it; `batch_transforms` (Python
    callables taking and returning a `Batch`) run on every batch, uncached.

    `stacks={"x": ["t2m", "u10"]}` makes those labels the channels of one batch array `x`,
    shaped (batch, 2, *field), in that order, written in place by the library (no copy after
    the batch, unlike `Batch.stack`); the labels need one sample shape and dtype (after their
    chunk transforms) and have no arrays of their own. `array_formats` says what each batch
    array is.

    `mounts={"targets": "/data/targets.zarr"}` reads variables from a second store on the same
    sample axis: its array `tp` is the path `"targets/tp"` of this dataset, and a geometry
    opened on that store (`open_geometries("/data/targets.zarr")["tp"]`) may be given as it is.
    A value may be `(store, storage_options)`, that store's own object-store options. A
    geometry from a store that is neither `store` nor a mount is refused (its path would name
    an array of `store`). A mounted store that covers other times than `store` (targets from
    2000 on, inputs from 1979 on) is placed on its sample axis with
    `{"store": ..., "align": "time"}` (the two stores' `time` coordinates matched value for
    value, CF units of either kind), `{"containing": "time"}` (every anchor reads the sample
    whose period holds its time), `{"nearest": "time"}` (the sample nearest its time, the
    later on a tie) or `"align": k` (the mounted store starts at sample `k` of `store`); each
    anchor then reads both at the same time, `Batch.read_indices` gives each
    label's own index, and the anchors outside what every variable covers are dropped:
    `anchor_range` is the rest, a `sample_range` for `split_by_chunk`.

    `indexes={"c": day_of_year}` makes label `c` read sample `day_of_year[anchor]` of its
    array at each anchor (one entry per anchor): a climatology at each sample's day of year,
    a monthly mean at its month. It takes no part in which anchors are valid, and each of its
    chunks is read once a pass.

    `patch=(64, 64)` cuts a window of that shape from the last axes of every sample instead of
    delivering it whole (axes before them stay whole): batch arrays are
    (batch, *leading axes, 64, 64), every label of a row cut at the same origin (inputs,
    targets, static fields and stacks stay co-registered), `Batch.patch_origins` says where.
    Origins are uniform over the places the window fits, drawn again every epoch in `train`
    and the same every epoch in the other splits, from (seed, epoch, anchor) alone.
    `patch_wrap=(False, True)` (or one bool for every axis) makes patched axes periodic
    (longitude on a global grid): a window may start anywhere along them and run across the
    end. With one sample per chunk and a field stored as several chunks, a row reads only the
    chunks under its window; otherwise chunks are read, decoded and cached whole and the patch
    is cut as each row is copied. `patches_per_sample=4` cuts four patches from every sample,
    each a row of its own at an origin drawn apart, so an epoch has four times the rows from
    the same chunks read once. `patch_grid=True` tiles every field with patches instead (a
    stride such as `(32, 32)` overlaps them): origins every stride from 0, the last along an
    axis moved back to end at the field's edge (or running across the end of a periodic one),
    the same in every epoch and split, so that predictions stitched back at
    `Batch.patch_origins` cover each field whole (inference over large fields).
    """

    def __init__(
        self,
        store,
        manifest: SplitManifest | None = None,
        geometries: Mapping[str, ArrayGeometry] | None = None,
        *,
        batch_size: int = 32,
        block_chunks: int = 16,
        fast_first_batch: bool = False,
        prefetch_next_epoch: bool = False,
        sample_stride: int = 1,
        sample_phase: int = 0,
        max_inflight: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        prefetch_depth: int = 2,
        cache_dir=None,
        cache_budget_bytes: int | None = None,
        memory_limit_bytes: int | None = None,
        persist: bool = False,
        reset_stale_cache: bool = False,
        readonly_cache: bool = False,
        cache_direct_io: bool = True,
        on_bad_chunk: str = "raise",
        chunk_transforms: Iterable[Any] = (),
        batch_transforms: Iterable[Callable[[Batch], Batch]] = (),
        sample_axis: int = 0,
        executor_threads: int | None = None,
        io_backend: str | None = None,
        rank: int = 0,
        world_size: int = 1,
        even_train: bool = True,
        drop_last: bool | Sequence[str] = False,
        storage_options: Mapping[str, Any] | None = None,
        stacks: Mapping[str, Sequence[str]] | None = None,
        mounts: Mapping[str, Any] | None = None,
        indexes: Mapping[str, Any] | None = None,
        patch: Sequence[int] | None = None,
        patch_wrap: bool | Sequence[bool] = False,
        patches_per_sample: int = 1,
        patch_grid: bool | Sequence[int] = False,
    ):
        self._handle = None
        config: dict[str, Any] = {
            "store": _store_str(store),
            "batch_size": _check_int("batch_size", batch_size),
            "block_chunks": _check_int("block_chunks", block_chunks),
            "prefetch_depth": _check_int("prefetch_depth", prefetch_depth),
            "seed": _check_int("seed", seed, minimum=0),
            "sample_axis": _check_int("sample_axis", sample_axis, minimum=0),
            "rank": _check_int("rank", rank, minimum=0),
            "world_size": _check_int("world_size", world_size),
            "sample_stride": _check_int("sample_stride", sample_stride),
            "sample_phase": _check_int("sample_phase", sample_phase, minimum=0),
        }
        for name, flag in (
            ("shuffle", shuffle),
            ("even_train", even_train),
            ("fast_first_batch", fast_first_batch),
            ("prefetch_next_epoch", prefetch_next_epoch),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"`{name}` must be a bool, not {type(flag).__name__}")
            config[name] = flag
        if isinstance(drop_last, bool):
            config["drop_last"] = drop_last
        elif isinstance(drop_last, (list, tuple, set, frozenset)) and all(
            isinstance(s, str) for s in drop_last
        ):
            config["drop_last"] = sorted(drop_last)
        else:
            raise TypeError(
                "`drop_last` must be a bool or a list of split names such as ['train'], not "
                f"{drop_last!r}"
            )
        if on_bad_chunk not in ("raise", "nan"):
            raise errors.InvalidArgument(
                f"invalid argument `on_bad_chunk` = {on_bad_chunk!r}: use 'raise' or 'nan'"
            )
        config["on_bad_chunk"] = on_bad_chunk
        if max_inflight is not None:
            config["max_inflight"] = _check_int("max_inflight", max_inflight)
        if cache_budget_bytes is not None:
            config["cache_budget_bytes"] = _check_int("cache_budget_bytes", cache_budget_bytes)
        if memory_limit_bytes is not None:
            config["memory_limit_bytes"] = _check_int("memory_limit_bytes", memory_limit_bytes)
        for name, flag in (
            ("persist", persist),
            ("reset_stale_cache", reset_stale_cache),
            ("readonly_cache", readonly_cache),
            ("cache_direct_io", cache_direct_io),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"`{name}` must be a bool, not {type(flag).__name__}")
            config[name] = flag
        if cache_dir is not None:
            config["cache_dir"] = os.fspath(cache_dir)
        if storage_options is None and isinstance(geometries, Mapping):
            # Geometries from open_geometries(url, storage_options=...) carry their options.
            carried = [g.storage_options for g in geometries.values()
                       if isinstance(g, ArrayGeometry) and g.storage_options
                       and _same_store(g.store, config["store"])]
            storage_options = carried[0] if carried else None
        if storage_options is not None:
            config["storage_options"] = _storage_options(storage_options)
        self._storage_options = storage_options
        chunk_transforms, functions = _transforms._config_and_functions(chunk_transforms)
        if chunk_transforms:
            config["chunk_transforms"] = chunk_transforms
        if stacks is not None:
            config["stacks"] = _stacks(stacks)
        if patch is not None:
            if isinstance(patch, (str, bytes)) or not isinstance(patch, Sequence):
                raise TypeError(f"`patch` must be a sequence of ints such as (64, 64), not {patch!r}")
            shape = [_check_int(f"patch[{i}]", p) for i, p in enumerate(patch)]
            wrap = [patch_wrap] * len(shape) if isinstance(patch_wrap, bool) else patch_wrap
            if (isinstance(wrap, (str, bytes)) or not isinstance(wrap, Sequence)
                    or not all(isinstance(w, bool) for w in wrap)):
                raise TypeError(
                    f"`patch_wrap` must be a bool or one bool per patched axis, not {patch_wrap!r}"
                )
            config["patch"] = {"shape": shape, "wrap": list(wrap)}
            per_sample = _check_int("patches_per_sample", patches_per_sample)
            if per_sample != 1:
                config["patch"]["per_sample"] = per_sample
            if isinstance(patch_grid, bool):
                if patch_grid:
                    config["patch"]["grid"] = True
            elif isinstance(patch_grid, (str, bytes)) or not isinstance(patch_grid, Sequence):
                raise TypeError(
                    f"`patch_grid` must be a bool or a stride per patched axis such as (32, 32), "
                    f"not {patch_grid!r}"
                )
            else:
                config["patch"]["grid"] = [
                    _check_int(f"patch_grid[{i}]", g) for i, g in enumerate(patch_grid)
                ]
        else:
            for name, value, default in (("patch_wrap", patch_wrap, False),
                                         ("patches_per_sample", patches_per_sample, 1),
                                         ("patch_grid", patch_grid, False)):
                # Only a value of the default's own type compares (an array would not).
                if not (value is default or (type(value) is type(default) and value == default)):
                    raise errors.InvalidArgument(
                        f"`{name}` places or shapes patches, and no `patch` is set: give one, "
                        "such as patch=(64, 64)"
                    )
        given = _mounts(mounts) if mounts is not None else {}
        if given:
            config["mounts"] = {
                name: loc if opts is None and align is None else {
                    "store": loc,
                    **({} if opts is None else {"storage_options": opts}),
                    **({} if align is None else {"align": align}),
                }
                for name, (loc, opts, align) in given.items()
            }
        self._mounts = {name: (loc, opts) for name, (loc, opts, _) in given.items()}
        if executor_threads is not None:
            config["executor_threads"] = _check_int("executor_threads", executor_threads)
        if io_backend is not None:
            config["io_backend"] = str(io_backend)
        if manifest is not None:
            if not isinstance(manifest, SplitManifest):
                raise TypeError(f"`manifest` must be a SplitManifest, not {type(manifest).__name__}")
            config["manifest"] = manifest.data
        if geometries is not None:
            if not isinstance(geometries, Mapping):
                raise TypeError("`geometries` must map labels to ArrayGeometry, not "
                                f"{type(geometries).__name__}")
            if not geometries:
                raise errors.InvalidArgument(
                    "`geometries` is empty: map at least one label to an ArrayGeometry, or pass "
                    "None for every data variable"
                )
            views = []
            for label, g in geometries.items():
                if not isinstance(g, ArrayGeometry):
                    raise TypeError(f"geometries[{label!r}] must be an ArrayGeometry, not {type(g).__name__}")
                if not -(2**63) <= g.offset < 2**63:
                    raise errors.InvalidArgument(
                        f"the window offset of label {label!r} is {g.offset}: shift(k) takes a "
                        "64-bit sample count"
                    )
                if g.sample_axis != sample_axis and not g.static:
                    config["sample_axis"] = g.sample_axis
                view = {"label": str(label), "path": self._path_of(label, g, config["store"]),
                        "offset": g.offset}
                if g.static:
                    view["static"] = True
                if g.region is not None:
                    view["region"] = [list(r) for r in g.region]
                    view["wrap"] = g.wraps
                views.append(view)
            config["variables"] = views
        self._indexes = _indexes(indexes, config.get("variables"))
        self._transforms = list(batch_transforms)
        for t in self._transforms:
            if not callable(t):
                raise TypeError(f"batch_transforms: {t!r} is not callable")
        # Opening reads the store's metadata: interruptible. Python functions among the chunk
        # transforms go as callbacks, which the library releases when it is done with them.
        if functions:
            cbs = _callbacks.callbacks(functions)
            self._handle = _call_interruptible(
                lib.isb_dataset_open_with_transforms, json.dumps(config).encode(),
                ctypes.cast(cbs, ctypes.c_void_p), len(functions), free=lib.isb_dataset_free,
            )
        else:
            self._handle = _call_interruptible(
                lib.isb_dataset_open, json.dumps(config).encode(), free=lib.isb_dataset_free
            )
        self.store = config["store"]
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.sample_stride, self.sample_phase = sample_stride, sample_phase
        self._last_stats: dict = {}
        info = self._dataset_stats()
        self._offsets = {v["label"]: v["offset"] for v in info["variables"]}
        # Where each label's store sits against the anchors, for a store mounted with an
        # alignment: its sample is (anchor * mul + add) // div, then the offset.
        self._placements = {
            v["label"]: (p["mul"], p["add"], p["div"])
            for v in info["variables"]
            if ((p := v["placement"])["mul"], p["add"], p["div"]) != (1, 0, 1)
        }
        self.anchor_range = range(*info["anchor_range"])
        # The window cut from every row (or None), and which of its axes are periodic.
        self.patch = tuple(info["patch"]) if info.get("patch") else None
        self.patch_wrap = tuple(info["patch_wrap"]) if self.patch else None
        # The rows each sample gives (its patches), and a grid's stride (None: drawn at random).
        self.patches_per_sample = int(info.get("patches_per_sample", 1))
        self.patch_grid = tuple(info["patch_grid"]) if info.get("patch_grid") else None
        # What one sample of each label is in a batch: after the chunk transforms (a cast or a
        # coarsen changes it), the geometry's inner shape and dtype without any.
        self.sample_formats = {
            v["label"]: (tuple(v["sample_shape"]), np.dtype(_DTYPES[v["sample_dtype"]]))
            for v in info["variables"]
        }
        # What each batch array is: a label's own, or a stack of labels, with its row's shape.
        self.array_formats = {
            a["name"]: (tuple(a["shape"]), np.dtype(_DTYPES[a["dtype"]])) for a in info["arrays"]
        }
        self.stacks = {a["name"]: list(a["labels"]) for a in info["arrays"] if a["stacked"]}
        self.geometries = {}
        for v in info["variables"]:
            # A mounted array's geometry names its own store, as open_geometries on it would.
            where, path, options = str(store), v["path"], self._storage_options
            name, _, rest = path.partition("/")
            if name in self._mounts:
                (where, options), path = self._mounts[name], rest
            self.geometries[v["label"]] = ArrayGeometry(
                store=where,
                path=path,
                shape=tuple(v["shape"]),
                chunks=tuple(v["chunks"]),
                dtype=v["dtype"],
                sample_axis=v["sample_axis"] if v["sample_axis"] is not None else 0,
                offset=v["offset"],
                storage_options=options,
                region=None if v.get("region") is None else tuple(tuple(r) for r in v["region"]),
                static=bool(v.get("static", False)),
            )
        self.manifest = SplitManifest(info["manifest"])
        self._warned = 0
        self._emit_warnings(info)

    def _path_of(self, label, g: ArrayGeometry, store: str) -> str:
        """The path geometry `g` has in this dataset: its own in `store`, or under the name of
        the mount it was opened on. A geometry of another store is refused: its path would
        read an array of `store`, or none."""
        if _same_store(g.store, store):
            return g.path
        for name, (location, _) in self._mounts.items():
            if _same_store(g.store, location):
                return f"{name}/{g.path}" if g.path else name
        raise errors.InvalidArgument(
            f"geometries[{label!r}] is array {g.path!r} of {g.store}, which is neither the "
            f"dataset's store {store} nor mounted in it; take the geometry from "
            f"open_geometries({store!r}), or mount its store: mounts={{'name': {g.store!r}}}"
        )

    def __repr__(self) -> str:
        # Also reached for a dataset whose __init__ raised part-way (in a traceback's locals).
        geoms = getattr(self, "geometries", {})
        store = getattr(self, "store", "?")
        mounts = getattr(self, "_mounts", {})
        mounted = f" mounts {({n: loc for n, (loc, _) in mounts.items()})}" if mounts else ""
        state = " closed" if self._handle is None else ""
        world_size = getattr(self, "world_size", 1)
        ranks = f" rank {self.rank} of {world_size}" if world_size > 1 else ""
        stride = getattr(self, "sample_stride", 1)
        strided = f" every {stride}th sample from {self.sample_phase}" if stride > 1 else ""
        return (
            f"<insitubatch.InSituDataset {store!r}{mounted} variables {list(geoms)} "
            f"batch_size {getattr(self, 'batch_size', '?')}{strided}{ranks}{state}>"
        )

    def _emit_warnings(self, info: dict) -> None:
        new = info.get("warnings", [])[self._warned:]
        self._warned += len(new)
        for w in new:
            warnings.warn(w, errors.CacheWarning, stacklevel=3)

    # views -----------------------------------------------------------------------------
    @property
    def train(self) -> _View:
        return _View(self, "train")

    @property
    def val(self) -> _View:
        return _View(self, "val")

    @property
    def test(self) -> _View:
        return _View(self, "test")

    @property
    def all(self) -> _View:
        return _View(self, "all")

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise errors.Closed("the dataset is closed; open a new InSituDataset")
        return self._handle

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration draws (the order depends on (seed, epoch) only)."""
        err = ctypes.c_void_p()
        _check(lib.isb_dataset_set_epoch(self._live(), _check_int("epoch", epoch, 0), ctypes.byref(err)), err)

    def _dataset_stats(self) -> dict:
        return _json_call(lib.isb_dataset_stats_json, self._live())

    @property
    def prefetched_epoch(self) -> int | None:
        """The epoch of the train iteration `prefetch_next_epoch` started early that waits to be
        asked for (`set_epoch` to it, then iterate `train`): `None` while there is none, while it
        is still starting, and once it could not start (a warning then says why)."""
        info = self._dataset_stats()
        self._emit_warnings(info)
        return info["prefetched_epoch"]

    def coordinates(self, label: str, dimension: str | None = None, *,
                    decode_times: bool = True) -> np.ndarray:
        """The coordinate values of label `label`'s array along `dimension` (default: the
        sample axis, so `ds.coordinates("x")[batch.read_indices("x")]` is each row's time), as
        `coordinate_values` reads them: datetime64 for CF times unless `decode_times=False`."""
        if label not in self.geometries:
            raise KeyError(f"no label {label!r}; the dataset has {list(self.geometries)}")
        g = self.geometries[label]
        if g.static and dimension is None:
            raise errors.InvalidArgument(
                f"label {label!r} is a static field: it has no sample axis; name the dimension "
                "whose coordinate to read"
            )
        return coordinate_values(g.store, g.path, dimension, sample_axis=g.sample_axis,
                                 decode_times=decode_times, storage_options=g.storage_options)

    def memory_need(self, split: str = "train") -> dict:
        """The memory an iteration over `split` would hold at its peak, counted from its plan
        without reading anything. `total_bytes` is what starting the iteration checks against
        this process's memory limit (the machine's, its cgroup's, `ulimit -v`): the figure to
        size a job by. Its parts are `working_set_bytes`, `pool_bytes`, `cache_budget_bytes`
        (None unless a budget above the working set sizes the pool), `batch_bytes`, `batches`
        (of which `rows_batches` are filled ahead of the gather by chunks decoded straight into
        batch rows), `read_bytes` (read buffers, and with a `cache_dir` the slot files being
        written) and `overhead_bytes`, and `others_bytes`, what the `other_passes`
        iterations running in this process now hold beside it (counted in the total: a pass
        zipped beside another needs room for both); `limit_bytes`, `limit_source` and `fits`
        give the limit (`limit_source` is `memory_limit_bytes` when the dataset's own is the
        lower). The interpreter, the framework and the model come on top: `process_rss_bytes`,
        this process's resident memory as it asks, is that host when asked before
        iterating."""
        if not isinstance(split, str):
            raise TypeError("split must be a str")
        return _json_call(lib.isb_dataset_memory_json, self._live(), split.encode())

    def order(self, split: str = "train") -> EpochOrder:
        """The order the current epoch of `split` draws (see `set_epoch`), planned without
        reading anything: the samples in the order the batches emit them and the shuffle blocks
        they are drawn from. The same arguments give the same order on any machine, thread count
        and IO backend. Raises as iterating would for an unknown or empty split."""
        if not isinstance(split, str):
            raise TypeError("split must be a str")
        n_samples, n_blocks = ctypes.c_size_t(), ctypes.c_size_t()
        err = ctypes.c_void_p()
        args = (self._live(), split.encode())
        _check(lib.isb_dataset_order(*args, None, 0, ctypes.byref(n_samples), None, 0,
                                     ctypes.byref(n_blocks), ctypes.byref(err)), err)
        samples = np.empty(n_samples.value, dtype=np.uint64)
        ends = np.empty(n_blocks.value, dtype=np.uint64)
        _check(lib.isb_dataset_order(*args, samples.ctypes.data, samples.size, ctypes.byref(n_samples),
                                     ends.ctypes.data, ends.size, ctypes.byref(n_blocks),
                                     ctypes.byref(err)), err)
        # Sample indices are below 2**63: the same bytes read as int64, without a copy.
        return EpochOrder(samples.view(np.int64), ends.view(np.int64))

    def _split_len(self, split: str) -> tuple[int, int]:
        samples, batches = ctypes.c_uint64(), ctypes.c_uint64()
        err = ctypes.c_void_p()
        _check(
            lib.isb_dataset_split_len(
                self._live(), split.encode(), ctypes.byref(samples), ctypes.byref(batches), ctypes.byref(err)
            ),
            err,
        )
        return samples.value, batches.value

    def statistics(self, split: str = "train", axis: int | None = None,
                   quantiles: Sequence[float] | None = None) -> dict[str, "Statistics"]:
        """The statistics of every batch array (each label's, each stack's) over one epoch of
        `split` as this dataset yields it, accumulated in the library in float64: a
        `Statistics` per array name, per index along inner axis `axis` (0 the first after the
        sample axis: per level, or a stack's channels) or over whole samples (`axis=None`,
        scalars). `quantiles=(0.01, 0.99)` adds the values at those probabilities (each in
        [0, 1], at most 64), from a histogram of every value: within 1/256 of numpy's. The
        values are those the library delivers, after chunk transforms (fit a `Standardize` on a
        dataset without it) and before batch transforms. It runs an epoch like iterating does
        (Ctrl-C stops it)."""
        params: dict[str, Any] = {}
        if axis is not None:
            params["axis"] = _check_int("axis", axis, minimum=0)
        if quantiles is not None:
            try:
                probabilities = [float(q) for q in quantiles]
            except (TypeError, ValueError):
                raise TypeError("quantiles must be a sequence of probabilities, "
                                "e.g. (0.01, 0.99)") from None
            params["quantiles"] = probabilities  # the library checks their range
        acc = ctypes.c_void_p()
        err = ctypes.c_void_p()
        _check(lib.isb_statistics_new(self._live(), json.dumps(params).encode(),
                                      ctypes.byref(acc), ctypes.byref(err)), err)
        try:

            def add(handle: ctypes.c_void_p) -> None:
                _check(lib.isb_statistics_add(acc, handle, ctypes.byref(err)), err)

            for _ in self._iterate(split, on_handle=add):
                pass
            raw = _json_call(lib.isb_statistics_json, acc)
        finally:
            lib.isb_statistics_free(acc)
        return {name: Statistics._from_json(v) for name, v in raw.items()}

    def _iterate(self, split: str, start_batch: int = 0,
                 on_handle: Callable[[ctypes.c_void_p], None] | None = None) -> "_Epoch":
        if not isinstance(split, str):
            raise TypeError("split must be a str")
        it = ctypes.c_void_p()
        err = ctypes.c_void_p()
        n_batches = self._split_len(split)[1]
        _check(
            lib.isb_iter_start_at(self._live(), split.encode(), start_batch, ctypes.byref(it), ctypes.byref(err)),
            err,
        )
        return _Epoch(self, it, n_batches - start_batch, on_handle)

    # reports ---------------------------------------------------------------------------
    def stats(self) -> dict:
        """The last finished (or stopped) iteration's report plus the pool's counters."""
        out = dict(self._last_stats)
        out["pool"] = self._dataset_stats()["pool"]
        return out

    def cache_stats(self) -> dict | None:
        """Counters of the cache directory (`None` without `cache_dir`): writes, write_bytes,
        write_errors, writes_skipped (spill writes not started because the slot had been
        evicted), revived, rejected, cached_chunks, direct_io."""
        info = self._dataset_stats()
        self._emit_warnings(info)
        return info["cache"]

    @property
    def cache_hits(self) -> int:
        """Hits of the last iteration (resident or revived from `cache_dir`)."""
        return int(self._last_stats.get("cache_hits", 0))

    @property
    def cache_revived(self) -> int:
        """Hits of the last iteration revived from `cache_dir` files (no fetch, no decode)."""
        return int(self._last_stats.get("cache_revived", 0))

    @property
    def cache_misses(self) -> int:
        return int(self._last_stats.get("cache_misses", 0))

    @property
    def bad_chunks(self) -> list:
        return [
            (b["array"], tuple(b["chunk_index"]), b["key"])
            for b in self._last_stats.get("bad_chunks", [])
        ]

    # lifetime --------------------------------------------------------------------------
    def __reduce__(self):
        _not_picklable("an InSituDataset")

    def close(self) -> None:
        """Releases the dataset (idempotent). Batches already handed out stay valid."""
        handle, self._handle = self._handle, None
        if handle is not None:
            lib.isb_dataset_free(handle)

    def __enter__(self) -> "InSituDataset":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


def shuffle_quality(order, samples_per_chunk: int) -> float:
    """How close an emitted order (sample indices) is to a perfect global shuffle: 1.0 is
    indistinguishable from one, 0.0 is sequential (the same score as the Rust engine's)."""
    # (Sample indices are int64: a larger chunk holds every one of them alike.)
    spc = min(_check_int("samples_per_chunk", samples_per_chunk), 2**63 - 1)
    o = np.asarray(order)
    if o.ndim != 1 or not (o.size == 0 or np.issubdtype(o.dtype, np.integer)):
        raise TypeError("`order` must be a 1-D sequence of sample indices "
                        f"(ds.order().sample_indices), not {type(order).__name__} "
                        f"of {o.dtype} shaped {o.shape}")
    o = o.astype(np.int64)
    n = len(o)
    if n < 3:
        return 1.0
    same = float(np.mean(o[1:] // spc == o[:-1] // spc))
    expected = min((min(spc, n) - 1) / (n - 1), 1.0)
    mixing = 1.0 if expected >= 1.0 else float(np.clip(1.0 - max(same - expected, 0.0) / (1.0 - expected), 0, 1))
    ranks = np.empty(n)
    ranks[np.argsort(o, kind="stable")] = np.arange(n)
    pos = np.arange(n, dtype=float)
    mean = (n - 1) / 2
    den = np.sum((pos - mean) ** 2)
    rho = float(np.sum((pos - mean) * (ranks - mean)) / den) if den > 0 else 0.0
    return (mixing + (1.0 - abs(rho))) / 2.0
