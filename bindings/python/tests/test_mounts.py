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


def write_timed_stores(tmp_path, n=N, start=10, n_targets=25, step_hours=6):
    """era5.zarr: t2m with `time` 6-hourly from 2000-01-01 in hours (`n` samples); precip.zarr
    (v2): tp with `time` in days since 2000-01-01, from the inputs' sample `start` on every
    `step_hours`."""
    rng = np.random.default_rng(7)
    t2m = rng.normal(size=(n, 4, 6)).astype("f4")
    tp = rng.normal(size=(n_targets, 4, 6)).astype("f4")
    inputs = zarr.open_group(tmp_path / "era5.zarr", mode="w")
    inputs.create_array("t2m", data=t2m, chunks=(4, 4, 6), dimension_names=("time", "y", "x"))
    time = inputs.create_array("time", data=np.arange(n, dtype="i8") * 6, dimension_names=("time",))
    time.attrs["units"] = "hours since 2000-01-01 00:00"
    targets = zarr.open_group(tmp_path / "precip.zarr", mode="w", zarr_format=2)
    a = targets.create_array("tp", data=tp, chunks=(7, 4, 6))
    a.attrs["_ARRAY_DIMENSIONS"] = ["time", "y", "x"]
    days = (start * 6 + np.arange(n_targets) * step_hours) / 24
    time = targets.create_array("time", data=days.astype("f8"))
    time.attrs.update({"_ARRAY_DIMENSIONS": ["time"], "units": "days since 2000-01-01"})
    return tmp_path / "era5.zarr", tmp_path / "precip.zarr", t2m, tp


def test_a_mount_aligned_on_time_reads_both_stores_at_each_anchors_time(tmp_path):
    inputs, targets, t2m, tp = write_timed_stores(tmp_path)
    variables = {"x": isb.open_geometries(inputs)["t2m"], "y": isb.open_geometries(targets)["tp"]}
    reads = {}
    for align in ("time", 10):
        ds = isb.InSituDataset(inputs, None, variables, batch_size=4, seed=3,
                               mounts={"targets": {"store": targets, "align": align}})
        # The targets cover the inputs' samples 10..35, the inputs end at 30.
        assert ds.anchor_range == range(10, 30)
        anchors = check(ds, "all", {"x": t2m, "y": tp})
        assert sorted(anchors) == list(range(10, 30))
        assert ds.stats()["dropped_anchors"] == 10
        batch = next(iter(ds.all))
        np.testing.assert_array_equal(batch.read_indices("y"), batch.sample_indices - 10)
        reads[align] = anchors
    assert reads["time"] == reads[10]

    # A split over the shared samples holds only the chunks that overlap them.
    x = variables["x"]
    manifest = isb.split_by_chunk(x, (0.8, 0.2), sample_range=ds.anchor_range)
    ds = isb.InSituDataset(inputs, manifest, variables, batch_size=4,
                           mounts={"targets": {"store": targets, "align": "time"}})
    seen = check(ds, "train", {"x": t2m, "y": tp}) + check(ds, "val", {"x": t2m, "y": tp})
    assert sorted(seen) == list(range(10, 30))
    assert not any(c * 4 + 4 <= 10 for s in manifest.splits.values() for c in s)


def test_a_mount_at_another_rate_is_read_where_its_times_meet_the_anchors(tmp_path):
    # 12-hourly targets from the inputs' tenth sample: every second anchor from the tenth.
    inputs, targets, t2m, tp = write_timed_stores(tmp_path, step_hours=12)
    variables = {"x": isb.open_geometries(inputs)["t2m"], "y": isb.open_geometries(targets)["tp"]}
    mounts = {"t": {"store": targets, "align": "time"}}
    with pytest.raises(errors.InvalidArgument, match="sample_stride 2, sample_phase 0"):
        isb.InSituDataset(inputs, None, variables, mounts=mounts)
    ds = isb.InSituDataset(inputs, None, variables, mounts=mounts, sample_stride=2, batch_size=4)
    anchors = check(ds, "all", {"x": t2m, "y": tp})
    assert sorted(anchors) == list(range(10, 30, 2))
    batch = next(iter(ds.all))
    np.testing.assert_array_equal(batch.read_indices("y"), (batch.sample_indices - 10) // 2)
    np.testing.assert_array_equal(ds.coordinates("x")[batch.read_indices("x")],
                                  ds.coordinates("y")[batch.read_indices("y")])


def test_a_containing_mount_is_read_at_every_anchor_its_periods_hold(tmp_path):
    # 12-hourly targets from the inputs' tenth sample: every anchor from the tenth reads the
    # target whose twelve hours hold its time, (anchor - 10) // 2, with no sample stride.
    inputs, targets, t2m, tp = write_timed_stores(tmp_path, step_hours=12)
    variables = {"x": isb.open_geometries(inputs)["t2m"], "y": isb.open_geometries(targets)["tp"]}
    ds = isb.InSituDataset(inputs, None, variables, batch_size=4,
                           mounts={"t": {"store": targets, "align": {"containing": "time"}}})
    assert ds.anchor_range == range(10, 30)
    anchors = check(ds, "all", {"x": t2m, "y": tp})
    assert sorted(anchors) == list(range(10, 30))
    batch = next(iter(ds.all))
    np.testing.assert_array_equal(batch.read_indices("y"), (batch.sample_indices - 10) // 2)
    for bad in ({"containing": 3}, {"containing": "time", "x": 1}, {"near": "time"}, {}):
        with pytest.raises(TypeError, match="the `align` of 't'"):
            isb.InSituDataset(inputs, mounts={"t": {"store": targets, "align": bad}})


def test_a_nearest_mount_is_read_at_the_sample_nearest_each_anchor(tmp_path):
    # 12-hourly targets from the inputs' tenth sample, read nearest: anchor a (6a hours) reads
    # the target nearest its time, the later of two equally near, so anchor 9 (6 hours before
    # the first target) reads it too; the last, at the inputs' 28th sample, is read through
    # anchor 28 (anchor 29 is as near the target after it, which the store lacks).
    inputs, targets, t2m, tp = write_timed_stores(tmp_path, step_hours=12, n_targets=10)
    variables = {"x": isb.open_geometries(inputs)["t2m"], "y": isb.open_geometries(targets)["tp"]}
    ds = isb.InSituDataset(inputs, None, variables, batch_size=4,
                           mounts={"t": {"store": targets, "align": {"nearest": "time"}}})
    assert ds.anchor_range == range(9, 29)
    anchors = check(ds, "all", {"x": t2m, "y": tp})
    assert sorted(anchors) == list(range(9, 29))
    times_x = ds.coordinates("x").astype("datetime64[h]").astype("i8")
    times_y = ds.coordinates("y").astype("datetime64[h]").astype("i8")
    for batch in ds.all:
        for a, j in zip(batch.sample_indices, batch.read_indices("y")):
            gaps = np.abs(times_y - times_x[a])
            nearest = np.flatnonzero(gaps == gaps.min()).max()  # the later on a tie
            assert j == nearest, (a, j, nearest)


def test_mounts_that_do_not_align_are_refused_saying_why(tmp_path):
    inputs, targets, *_ = write_timed_stores(tmp_path, step_hours=12)
    variables = {"x": isb.open_geometries(inputs)["t2m"], "y": isb.open_geometries(targets)["tp"]}
    gappy = zarr.open_group(targets, mode="a", zarr_format=2)["time"]
    gappy[3:] = gappy[3:] + 0.5  # twelve more hours from the fourth on: uneven steps
    with pytest.raises(errors.InvalidArgument,
                       match=r"`mounts` = t.*align only when each steps evenly.*by 24 h from its index 2"):
        isb.InSituDataset(inputs, None, variables, mounts={"t": {"store": targets, "align": "time"}})
    with pytest.raises(errors.InvalidArgument, match="share no anchor"):
        isb.InSituDataset(inputs, None, variables, mounts={"t": {"store": targets, "align": 40}})
    with pytest.raises(errors.InvalidArgument, match="cannot align on `level`: there is no coordinate array `level` beside `t2m`"):
        isb.InSituDataset(inputs, None, variables, mounts={"t": {"store": targets, "align": "level"}})
    # Unequal lengths without an alignment say how to align.
    with pytest.raises(errors.InvalidArgument, match="has 25.*align"):
        isb.InSituDataset(inputs, None, variables, mounts={"t": targets})
    for bad in (True, 1.5, "", [1]):
        with pytest.raises(TypeError, match="the `align` of 't'"):
            isb.InSituDataset(inputs, mounts={"t": {"store": targets, "align": bad}})
    with pytest.raises(TypeError, match="`mounts` must map"):
        isb.InSituDataset(inputs, mounts={"t": {"store": targets, "start": 3}})
    with pytest.raises(errors.InvalidArgument, match="sample_range"):
        isb.split_by_chunk(variables["x"], sample_range=range(0, 10, 2))


def test_the_different_times_example_in_the_python_docs_reads_what_it_says(tmp_path,
                                                                          python_docs_example):
    """docs/python-api.md, "Stores that cover different times": its example as printed, over
    inputs of 300 samples and targets from the inputs' 100th: every row of both at one time."""
    inputs, targets, t2m, tp = write_timed_stores(tmp_path, n=300, start=100, n_targets=250)
    code = python_docs_example("**Stores that cover different times.**")
    code = code.replace("/data/era5.zarr", str(inputs)).replace("/data/precip.zarr", str(targets))
    scope = {"isb": isb}
    exec(code, scope)
    ds = scope["ds"]
    assert ds.anchor_range == range(100, 300)
    seen = []
    for split in ("train", "val", "test"):
        for batch in getattr(ds, split):
            t = batch.sample_indices
            np.testing.assert_array_equal(batch.arrays["x"], t2m[t])
            np.testing.assert_array_equal(batch.arrays["y"], tp[t - 100])
            np.testing.assert_array_equal(ds.coordinates("x")[batch.read_indices("x")],
                                          ds.coordinates("y")[batch.read_indices("y")])
            seen += t.tolist()
    assert sorted(seen) == list(range(100, 300))
    ds.close()


def test_rounding_mounts_read_a_store_that_ends_before_the_inputs_start(tmp_path):
    # Daily targets at 1999-12-30T18 and 1999-12-31T18, both before the 6-hourly inputs' first
    # time: the second one's day holds the inputs' first three times (containing), and is the
    # nearest sample to the first only (nearest); the stores share no time, which an exact
    # alignment refuses.
    inputs, targets, t2m, tp = write_timed_stores(tmp_path, start=-5, n_targets=2, step_hours=24)
    variables = {"x": isb.open_geometries(inputs)["t2m"], "y": isb.open_geometries(targets)["tp"]}
    for align, anchors in (({"containing": "time"}, range(0, 3)), ({"nearest": "time"}, range(0, 1))):
        ds = isb.InSituDataset(inputs, None, variables, batch_size=4,
                               mounts={"t": {"store": targets, "align": align}})
        assert ds.anchor_range == anchors, align
        assert sorted(check(ds, "all", {"x": t2m, "y": tp})) == list(anchors)
        assert all((b.read_indices("y") == 1).all() for b in ds.all)
    with pytest.raises(errors.InvalidArgument, match="share no `time`"):
        isb.InSituDataset(inputs, None, variables, mounts={"t": {"store": targets, "align": "time"}})
    # One time says no period: refused for a rounding alignment, naming the store.
    inputs, targets, *_ = write_timed_stores(tmp_path, n_targets=1, step_hours=24)
    variables = {"x": isb.open_geometries(inputs)["t2m"], "y": isb.open_geometries(targets)["tp"]}
    with pytest.raises(errors.InvalidArgument, match="`mounts` = t.*holds one time"):
        isb.InSituDataset(inputs, None, variables,
                          mounts={"t": {"store": targets, "align": {"nearest": "time"}}})


def test_the_nearest_example_in_the_python_docs_reads_each_samples_own_day(tmp_path,
                                                                           python_docs_example):
    """docs/python-api.md, "The nearest time": its example as printed, over 6-hourly inputs
    from 2000-01-01T00 and daily values stamped at noon from the same day: every sample reads
    its own day (at 00:00 the day before's noon is as near, and the later wins)."""
    inputs, targets, t2m, tp = write_timed_stores(tmp_path, n=30, start=2, n_targets=7,
                                                  step_hours=24)
    code = python_docs_example("**The nearest time.**")
    code = (code.replace("/data/era5_6h.zarr", str(inputs))
            .replace("/data/daily_noon.zarr", str(targets)))
    scope = {"isb": isb}
    exec(code, scope)
    ds = scope["ds"]
    assert ds.anchor_range == range(0, 28)  # seven days of four samples
    seen = []
    for batch in ds.all:
        t = batch.sample_indices
        np.testing.assert_array_equal(batch.read_indices("y"), t // 4)
        np.testing.assert_array_equal(batch.arrays["y"], tp[t // 4])
        np.testing.assert_array_equal(batch.arrays["x"], t2m[t])
        seen += t.tolist()
    assert sorted(seen) == list(range(28))
    ds.close()
