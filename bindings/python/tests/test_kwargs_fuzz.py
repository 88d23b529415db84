"""`InSituDataset` over random keyword arguments: a valid set using most of them, with one to
three replaced by values of other types, ranges and shapes. Whatever they are, the constructor
and a few batches of each split either work or raise `TypeError`, `ValueError` or an
`insitubatch.Error` that is not an `InternalError` (a panic or a bug), with a message; never
another exception, a crash or a hang (a watchdog dumps the threads after 120 s).
The other entry points get random arguments the same way, and odd CF time coordinates are
decoded every way the shim decodes times. `ISB_PY_KWARGS_CASES=n` draws more cases than the
150 of a run."""

import faulthandler
import os
import random

import numpy as np
import pytest
import zarr

import insitubatch as isb
from insitubatch import errors, transforms

ODD = [None, True, False, 0, 1, -1, 2**63, 2**64, 2**70, -(2**63) - 1, 2.5, float("nan"),
       float("inf"), "", "x", "..", "t2m", "time", "1979-01-01", [], [1, "a"], (0, 1), {},
       {"a": 1}, {"nearest": 3}, {"x": ["t2m", "t2m"]}, b"bytes", object(), np.int64(3),
       np.float32(1.5), np.arange(3), np.arange(24) * 5, ["train", "bogus"], "threads",
       "uring", "nan", "raise"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("kwargs_fuzz")
    g = zarr.open_group(root / "era5.zarr", mode="w")
    rng = np.random.default_rng(3)
    g.create_array("t2m", data=rng.normal(size=(24, 3, 4)).astype("f4"), chunks=(4, 3, 4),
                   dimension_names=("time", "y", "x"))
    g.create_array("u10", data=rng.normal(size=(24, 3, 4)).astype("f4"), chunks=(3, 3, 4),
                   dimension_names=("time", "y", "x"))
    time = g.create_array("time", data=np.arange(24, dtype="i8") * 6, dimension_names=("time",))
    time.attrs["units"] = "hours since 2000-01-01"
    g.create_array("y", data=np.linspace(0.0, 2.0, 3), dimension_names=("y",))
    g.create_array("x", data=np.linspace(0.0, 3.0, 4), dimension_names=("x",))
    g.create_array("orog", data=rng.normal(size=(3, 4)).astype("f4"), chunks=(2, 4),
                   dimension_names=("y", "x"))
    g.create_array("clim", data=rng.normal(size=(7, 3, 4)).astype("f4"), chunks=(2, 3, 4),
                   dimension_names=("time", "y", "x"))
    return root


def base_kwargs(root):
    store = root / "era5.zarr"
    geoms = isb.open_geometries(store, variables=["t2m", "u10", "orog", "clim"])
    mounted = isb.open_geometries(store, variables=["t2m"])["t2m"]
    variables = {"t2m": geoms["t2m"], "y": geoms["t2m"].shift(2),
                 "u": geoms["u10"].crop((0, 2), (-1, 3), wrap=True),
                 "o": geoms["orog"].as_static(), "c": geoms["clim"], "m": mounted}
    return store, dict(
        geometries=variables, batch_size=5, block_chunks=2, fast_first_batch=True, prefetch_next_epoch=True,
        sample_stride=2, sample_phase=1, max_inflight=3, seed=4, shuffle=True,
        prefetch_depth=2, cache_dir=root / "cache", cache_budget_bytes=1 << 20,
        on_bad_chunk="nan", chunk_transforms=[transforms.Affine(2.0, 1.0)],
        executor_threads=1, io_backend="threads", drop_last=["train"],
        stacks={"x": ["t2m", "y"]},
        mounts={"again": {"store": store, "align": {"nearest": "time"}}},
        indexes={"c": np.arange(24) % 7}, manifest=None, rank=0, world_size=1,
        even_train=True, persist=False, reset_stale_cache=False, readonly_cache=False,
        cache_direct_io=False, memory_limit_bytes=1 << 34, batch_transforms=(lambda b: b,),
        sample_axis=0, storage_options=None, patch=(3,), patch_wrap=(True,),
        patches_per_sample=2, patch_grid=False)


def exercise(store, kwargs, case):
    """Builds the dataset and reads a few batches of each split; returns whether it opened."""
    try:
        ds = isb.InSituDataset(store, **kwargs)
    except errors.InternalError as e:
        pytest.fail(f"case {case}: {e!r}\n{kwargs}")
    except (TypeError, ValueError, errors.Error) as e:
        assert str(e), f"case {case}: {type(e).__name__} without a message"
        return False
    with ds:
        for split in ("train", "val", "all"):
            try:
                for _, batch in zip(range(3), getattr(ds, split)):
                    assert len(batch) > 0
            except errors.InternalError as e:
                pytest.fail(f"case {case}, {split}: {e!r}\n{kwargs}")
            except (TypeError, ValueError, errors.Error) as e:
                assert str(e), f"case {case}: {type(e).__name__} without a message"
    return True


def test_random_keyword_arguments_raise_clear_errors_or_work(stores):
    store, base = base_kwargs(stores)
    faulthandler.dump_traceback_later(120, exit=True)
    try:
        assert exercise(store, base, "base")
        cases = int(os.environ.get("ISB_PY_KWARGS_CASES", "150"))
        opened = 0
        for case in range(cases):
            r = random.Random(case)
            kwargs = dict(base)
            for _ in range(r.randint(1, 3)):
                key = r.choice(sorted(kwargs))
                if key == "cache_dir":
                    # A relative odd path would land in the working directory.
                    kwargs[key] = stores / "odd" / str(case) if r.random() < 0.5 else ""
                else:
                    kwargs[key] = r.choice(ODD)
            opened += exercise(store, kwargs, case)
        print(f"{opened} of {cases} cases opened")
        assert opened >= 1, f"none of {cases} cases opened"
    finally:
        faulthandler.cancel_dump_traceback_later()


def calls(root, ds):
    """(name, function, positional arguments, keyword arguments) of the library's other entry
    points, each valid as given."""
    store = root / "era5.zarr"
    g = isb.open_geometries(store, variables=["t2m"])["t2m"]
    lat = np.linspace(0.0, 2.0, 3)
    lon = np.linspace(0.0, 3.0, 4)
    return [
        ("open_geometries", isb.open_geometries, [store], {"variables": ["t2m"], "sample_axis": 0,
                                                           "storage_options": None}),
        ("split_by_chunk", isb.split_by_chunk, [g, (0.5, 0.25, 0.25)],
         {"seed": 1, "contiguous": True, "sample_range": range(0, 24)}),
        ("split_by_ranges", isb.split_by_ranges, [g, {"train": (0, 12), "val": ("2000-01-04", 24)}],
         {"snap": "exact"}),
        ("coordinate_values", isb.coordinate_values, [store, "t2m"],
         {"dimension": "time", "sample_axis": 0, "decode_times": True}),
        ("coordinate_region", isb.coordinate_region, [store, "t2m", {"y": (0, 2)}], {}),
        ("shift", g.shift, [2], {}),
        ("crop", g.crop, [(0, 2), (1, 3)], {"wrap": False}),
        ("crop_coords", g.crop_coords, [{"y": (0, 1)}], {}),
        ("from_batch", lambda k: list(ds.train.from_batch(k)), [1], {}),
        ("order", ds.order, ["train"], {}),
        ("memory_need", ds.memory_need, ["all"], {}),
        ("statistics", ds.statistics, ["train"], {"axis": None}),
        ("coordinates", ds.coordinates, ["t2m"], {"dimension": "time"}),
        ("shuffle_quality", isb.shuffle_quality, [np.arange(24), 4], {}),
        ("Affine", transforms.Affine, [2.0, 1.0], {"axis": None}),
        ("Standardize", transforms.Standardize, [[1.0, 2.0, 3.0], [1.0, 1.0, 2.0]], {"axis": 0}),
        ("Clip", transforms.Clip, [0.0, 1.0], {}),
        ("Cast", transforms.Cast, ["float64"], {}),
        ("Coarsen", transforms.Coarsen, [(1, 2)], {}),
        ("Regrid", transforms.Regrid, [(0, 1), (lat, lon), (lat[:2], lon[:3])],
         {"method": "linear", "sphere": False}),
        ("preview", transforms.preview, [store, "t2m", [transforms.Affine(2.0)]], {"chunk": 1}),
    ]


def test_random_arguments_to_the_other_entry_points_raise_clear_errors_or_work(stores):
    store, base = base_kwargs(stores)
    ds = isb.InSituDataset(store, batch_size=4, seed=1,
                           geometries={"t2m": isb.open_geometries(store)["t2m"]})
    faulthandler.dump_traceback_later(120, exit=True)
    try:
        entries = calls(stores, ds)
        for name, fn, args, kwargs in entries:
            fn(*args, **kwargs)  # valid as given
        cases = int(os.environ.get("ISB_PY_KWARGS_CASES", "150")) * 2
        for case in range(cases):
            r = random.Random(10_000 + case)
            name, fn, args, kwargs = entries[case % len(entries)]
            args, kwargs = list(args), dict(kwargs)
            for _ in range(r.randint(1, 2)):
                if kwargs and (not args or r.random() < 0.5):
                    kwargs[r.choice(sorted(kwargs))] = r.choice(ODD)
                elif args:
                    args[r.randrange(len(args))] = r.choice(ODD)
            try:
                fn(*args, **kwargs)
            except errors.InternalError as e:
                pytest.fail(f"case {case}, {name}: {e!r}\n{args} {kwargs}")
            except (TypeError, ValueError, KeyError, errors.Error) as e:
                # (KeyError: a label the dataset does not have, as `batch.arrays[label]`.)
                assert str(e), f"case {case}, {name}: {type(e).__name__} without a message"
            except Exception as e:  # noqa: BLE001 - the point: nothing else may escape
                pytest.fail(f"case {case}, {name}: {type(e).__name__}: {e}\n{args} {kwargs}")
    finally:
        faulthandler.cancel_dump_traceback_later()
        ds.close()


UNITS = ["hours since 1979-01-01 00:00:00", "days since 1979-01-01", "hours since",
         "seconds since 1970-01-01T00:00:00Z", "minutes since 9999-12-31T23:59:59",
         "nanoseconds since 3000-01-01", "microseconds since 1970-01-01", "since 1979-01-01",
         "hours since 1979-13-45", "hours since 1979-01-01 25:61:61", "months since 2000-01-01",
         "hours since 1979-01-01 00:00:00 +05:00", "hours since 1e300", "hours", "",
         "hours since 292277026596-12-04", "days since 2000-02-30", "HOURS SINCE 2000-01-01",
         "hours since 1979-01-01T00:00:00.123456789", "days since 1979-1-1"]
TIMES = [np.arange(6, dtype="i8"), np.array([0, 2**62, 3, 4, 5, 6], dtype="i8"),
         np.array([0.5, 1e300, np.nan, 3, 4, 5]), np.array([-2**63, 0, 1, 2, 3, 4], dtype="i8"),
         np.arange(6, dtype="u8") + np.uint64(2**63), np.arange(6, dtype="f4")]


def test_odd_time_coordinates_decode_or_raise_clear_errors(tmp_path):
    """CF time coordinates with odd units, calendars and values, read as dates by
    `coordinate_values`, a dataset's `coordinates` and a split by dates: each works or raises
    one of the errors above, with a message, and no numpy warning (a cast that loses a value)."""
    import warnings
    for case in range(int(os.environ.get("ISB_PY_KWARGS_CASES", "150")) // 3):
        r = random.Random(20_000 + case)
        path = tmp_path / f"{case}.zarr"
        g = zarr.open_group(path, mode="w")
        t = g.create_array("time", data=r.choice(TIMES), dimension_names=("time",))
        t.attrs["units"] = r.choice(UNITS)
        if r.random() < 0.3:
            t.attrs["calendar"] = r.choice(["noleap", "360_day", "julian", "", "standard"])
        g.create_array("x", data=np.zeros((6, 2), "f4"), chunks=(2, 2),
                       dimension_names=("time", "y"))
        calls = [lambda: isb.coordinate_values(path, "x"),
                 lambda: isb.InSituDataset(path).coordinates("x"),
                 lambda: isb.split_by_ranges(isb.open_geometries(path)["x"],
                                             {"train": ("1979-01-01", "2000-01-01")})]
        for call in calls:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                try:
                    call()
                except errors.InternalError as e:
                    pytest.fail(f"case {case}: {e!r} ({dict(t.attrs)})")
                except (TypeError, ValueError, errors.Error) as e:
                    assert str(e), f"case {case}: {type(e).__name__} without a message"
