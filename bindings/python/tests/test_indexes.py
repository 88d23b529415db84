"""Indexed variables (`indexes=`): a climatology read at each sample's day of year equals
zarr-python's sample at that index in every row, alone and stacked; bad indexes are refused
naming the label; the docs' example reads what it says."""

import numpy as np
import pytest
import zarr

import insitubatch as isb
from insitubatch import errors


def write_store(tmp_path, n=40):
    """era5.zarr: `t2m` 6-hourly from 2000-12-30 (n samples, `time` in hours) and `t2m_clim`,
    one field per day of year (366)."""
    rng = np.random.default_rng(11)
    t2m = rng.normal(size=(n, 3, 4)).astype("f4")
    clim = rng.normal(size=(366, 3, 4)).astype("f4")
    g = zarr.open_group(tmp_path / "era5.zarr", mode="w")
    g.create_array("t2m", data=t2m, chunks=(4, 3, 4), dimension_names=("time", "y", "x"))
    g.create_array("t2m_clim", data=clim, chunks=(8, 3, 4),
                   dimension_names=("dayofyear", "y", "x"))
    time = g.create_array("time", data=np.arange(n, dtype="i8") * 6, dimension_names=("time",))
    time.attrs["units"] = "hours since 2000-12-30 00:00"
    return tmp_path / "era5.zarr", t2m, clim


def test_an_indexed_climatology_is_read_at_each_anchors_day(tmp_path):
    store, t2m, clim = write_store(tmp_path)
    geoms = isb.open_geometries(store)
    days = (np.arange(40) // 4 + 364) % 366     # 2000 is a leap year: days 364, 365, then 0 ...
    ds = isb.InSituDataset(store, None, {"x": geoms["t2m"], "c": geoms["t2m_clim"]},
                           indexes={"c": days.tolist()}, batch_size=6, seed=2)
    seen = []
    for batch in ds.train:
        t = batch.sample_indices
        np.testing.assert_array_equal(batch.read_indices("c"), days[t])
        np.testing.assert_array_equal(batch.arrays["c"], clim[days[t]])
        np.testing.assert_array_equal(batch.arrays["x"], t2m[t])
        seen += t.tolist()
    assert sorted(seen) == list(range(40))
    # Stacked beside the field of its shape.
    ds = isb.InSituDataset(store, None, {"x": geoms["t2m"], "c": geoms["t2m_clim"]},
                           indexes={"c": days}, stacks={"xc": ["x", "c"]}, batch_size=6)
    for batch in ds.train:
        t = batch.sample_indices
        np.testing.assert_array_equal(batch.arrays["xc"], np.stack([t2m[t], clim[days[t]]], 1))


def test_bad_indexes_are_refused_naming_the_label(tmp_path):
    store, *_ = write_store(tmp_path)
    geoms = isb.open_geometries(store)
    views = {"x": geoms["t2m"], "c": geoms["t2m_clim"]}
    with pytest.raises(errors.InvalidArgument, match=r"`indexes` = c.*39 entries.*40 anchors"):
        isb.InSituDataset(store, None, views, indexes={"c": np.zeros(39, int)})
    with pytest.raises(errors.InvalidArgument, match=r"sample 366 at anchor 0"):
        isb.InSituDataset(store, None, views, indexes={"c": np.full(40, 366)})
    with pytest.raises(errors.InvalidArgument, match=r"`indexes` = 'd'.*not a label"):
        isb.InSituDataset(store, None, views, indexes={"d": np.zeros(40, int)})
    with pytest.raises(errors.InvalidArgument, match=r"entry 3 is -1"):
        isb.InSituDataset(store, None, views, indexes={"c": [0, 0, 0, -1] + [0] * 36})
    with pytest.raises(TypeError, match=r"indexes\['c'\] must be a 1-D sequence of ints"):
        isb.InSituDataset(store, None, views, indexes={"c": np.zeros(40)})
    with pytest.raises(TypeError, match="`indexes` must map"):
        isb.InSituDataset(store, None, views, indexes=[1, 2])
    with pytest.raises(errors.InvalidArgument, match="window offset"):
        isb.InSituDataset(store, None, {"x": geoms["t2m"], "c": geoms["t2m_clim"].shift(1)},
                          indexes={"c": np.zeros(40, int)})


def test_the_climatology_example_in_the_python_docs_reads_what_it_says(tmp_path,
                                                                      python_docs_example):
    """docs/python-api.md, "A climatology at each sample's day of year", as printed, over a
    store whose times cross a leap year's end."""
    store, t2m, clim = write_store(tmp_path)
    code = python_docs_example("## A climatology at each sample's day of year")
    scope = {"isb": isb}
    exec(code.replace("/data/era5.zarr", str(store)), scope)
    ds = scope["ds"]
    days = (np.arange(40) // 4 + 364) % 366
    for batch in ds.train:
        t = batch.sample_indices
        np.testing.assert_array_equal(batch.arrays["xc"], np.stack([t2m[t], clim[days[t]]], 1))
