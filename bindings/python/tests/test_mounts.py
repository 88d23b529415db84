"""Variables from two stores (`mounts`): inputs from one archive, targets from another on the
same time axis, checked against zarr-python's reads of each store; geometries opened on the
mounted store translated, geometries of any other store refused (their path would read an
array of the dataset's own store)."""

import numpy as np
import pytest
import zarr

import insitubatch as isb
from insitubatch import errors

N = 30


@pytest.fixture()
def two_stores(tmp_path):
    return write_stores(tmp_path, N)


def write_stores(tmp_path, n):
    """inputs.zarr (v3, listed): t2m and a `tp` of its own; targets.zarr (v2, consolidated): tp
    with a CF time coordinate and another chunking; both `n` samples long."""
    rng = np.random.default_rng(5)
    t2m = rng.normal(size=(n, 4, 6)).astype("f4")
    own_tp = rng.normal(size=(n, 4, 6)).astype("f4")
    tp = rng.normal(size=(n, 4, 6)).astype("f4")
    inputs = zarr.open_group(tmp_path / "inputs.zarr", mode="w")
    inputs.create_array("t2m", data=t2m, chunks=(4, 4, 6), dimension_names=("time", "y", "x"))
    inputs.create_array("tp", data=own_tp, chunks=(4, 4, 6), dimension_names=("time", "y", "x"))
    targets = zarr.open_group(tmp_path / "targets.zarr", mode="w", zarr_format=2)
    a = targets.create_array("tp", data=tp, chunks=(7, 4, 6))
    a.attrs["_ARRAY_DIMENSIONS"] = ["time", "y", "x"]
    time = targets.create_array("time", data=np.arange(n, dtype="i8") * 6)
    time.attrs.update({"_ARRAY_DIMENSIONS": ["time"], "units": "hours since 2000-01-01"})
    zarr.consolidate_metadata(tmp_path / "targets.zarr")
    return tmp_path / "inputs.zarr", tmp_path / "targets.zarr", t2m, own_tp, tp


def check(ds, split, refs):
    """Every row of every label equals its store's values at its read index; returns the
    anchors drawn."""
    anchors = []
    for batch in getattr(ds, split):
        for label, ref in refs.items():
            np.testing.assert_array_equal(batch.arrays[label], ref[batch.read_indices(label)],
                                          err_msg=label)
        anchors.extend(batch.sample_indices.tolist())
    return anchors


def test_a_mounted_stores_variables_equal_zarr_python(two_stores):
    inputs, targets, t2m, _, tp = two_stores
    x = isb.open_geometries(inputs)["t2m"]
    y = isb.open_geometries(targets)["tp"]
    manifest = isb.split_by_chunk(x, (0.5, 0.25, 0.25), seed=1)
    ds = isb.InSituDataset(inputs, manifest, {"x": x, "y": y, "y_next": y.shift(2)},
                           mounts={"targets": targets}, batch_size=4, seed=9)
    refs = {"x": t2m, "y": tp, "y_next": tp}
    for batch in ds.train:
        np.testing.assert_array_equal(batch.read_indices("y_next"), batch.read_indices("y") + 2)
    seen = []
    for split in ("train", "val", "test"):
        seen += check(ds, split, refs)
    assert sorted(seen) == list(range(N - 2))
    # The mounted label's geometry names its own store; its coordinates come from there.
    g = ds.geometries["y"]
    assert (g.path, str(g.store)) == ("tp", str(targets))
    hours = (ds.coordinates("y") - np.datetime64("2000-01-01")) / np.timedelta64(1, "h")
    np.testing.assert_array_equal(hours, np.arange(N) * 6)
    assert "mounts {'targets':" in repr(ds)

    # A split made on the mounted store's `tp` is the dataset's `targets/tp`'s.
    by_y = isb.split_by_chunk(y, (0.5, 0.5), seed=1)
    ds = isb.InSituDataset(inputs, by_y, {"x": x, "y": y}, mounts={"targets": targets},
                           batch_size=4)
    assert ds.manifest.array == "targets/tp"
    train = sorted(check(ds, "train", {"x": t2m, "y": tp}))
    assert train == [i for c in by_y.splits["train"] for i in range(7 * c, min(7 * c + 7, N))]


def test_mounted_paths_name_the_arrays_without_geometries(two_stores):
    inputs, targets, t2m, own_tp, tp = two_stores
    ds = isb.InSituDataset(inputs, mounts={"targets": (str(targets), None)}, batch_size=8)
    assert sorted(ds.geometries) == ["t2m", "targets/tp", "tp"]
    # The root's own `tp` and the mounted one are different arrays, each read from its store.
    assert sorted(check(ds, "train", {"tp": own_tp, "targets/tp": tp, "t2m": t2m})) == list(range(N))


def test_a_geometry_of_a_store_not_mounted_is_refused(two_stores):
    inputs, targets, *_ = two_stores
    y = isb.open_geometries(targets)["tp"]
    # The dataset's store has a `tp` too: reading it would be silently wrong.
    with pytest.raises(errors.InvalidArgument, match=r"geometries\['y'\].*targets.zarr.*mount"):
        isb.InSituDataset(inputs, geometries={"y": y})
    with pytest.raises(errors.InvalidArgument, match=r"geometries\['y'\]"):
        isb.InSituDataset(inputs, geometries={"y": y}, mounts={"other": inputs})


def test_bad_mounts_are_refused_naming_them(two_stores, tmp_path):
    inputs, targets, *_ = two_stores
    with pytest.raises(TypeError, match="`mounts` must map"):
        isb.InSituDataset(inputs, mounts=[targets])
    with pytest.raises(TypeError, match="`mounts` must map"):
        isb.InSituDataset(inputs, mounts={"t": 5})
    with pytest.raises(TypeError, match="`mounts` must map"):
        isb.InSituDataset(inputs, mounts={1: targets})
    with pytest.raises(errors.InvalidArgument, match="as `tp`.*already has an array `tp`"):
        isb.InSituDataset(inputs, mounts={"tp": targets})
    with pytest.raises(errors.InvalidArgument, match="cannot contain `/`"):
        isb.InSituDataset(inputs, mounts={"a/b": targets})
    with pytest.raises(errors.NotFound, match="nowhere.zarr"):
        isb.InSituDataset(inputs, mounts={"t": tmp_path / "nowhere.zarr"})
    with pytest.raises(errors.InvalidArgument, match="aws_region"):
        isb.InSituDataset(inputs, mounts={"t": (targets, {"aws_region": "eu-west-1"})})
    short = zarr.open_group(tmp_path / "short.zarr", mode="w")
    short.create_array("tp", data=np.zeros((N - 1, 4, 6), "f4"), chunks=(4, 4, 6))
    with pytest.raises(errors.InvalidArgument, match=f"{N - 1}"):
        isb.InSituDataset(inputs, mounts={"s": tmp_path / "short.zarr"})


def test_the_two_stores_example_in_the_python_docs_reads_what_it_says(tmp_path, python_docs_example):
    """docs/python-api.md, "Inputs and targets from two stores": its example as printed, with
    the two stores it names written by zarr-python (200 samples, so that every split holds
    anchors whose target six samples on is in the array)."""
    n = 200
    inputs, targets, t2m, _, tp = write_stores(tmp_path, n)
    code = python_docs_example("## Inputs and targets from two stores")
    code = code.replace("/data/era5.zarr", str(inputs)).replace("/data/precip.zarr", str(targets))
    scope = {"isb": isb}
    exec(code, scope)
    ds = scope["ds"]
    rows = 0
    for split in ("train", "val", "test"):
        for batch in getattr(ds, split):
            t = batch.sample_indices
            np.testing.assert_array_equal(batch.arrays["x"], t2m[t])
            np.testing.assert_array_equal(batch.arrays["y"], tp[t + 6])
            rows += len(batch)
    assert rows == n - 6
    ds.close()
