"""Which samples a dataset draws: splits by ranges of samples or dates (whole chunks as `snap`
says, dates found where xarray's decode of the time coordinate puts them, a dataset over such a
manifest), and a sample stride (every k-th sample, from a phase)."""

import datetime

import numpy as np
import pytest
import zarr

import insitubatch as isb


def chunks_of(start, stop, n, spc, snap):
    """The model: the chunks a range takes, from the samples each chunk covers."""
    out = []
    for c in range(-(-n // spc)):
        lo, hi = c * spc, min((c + 1) * spc, n)
        inside = start <= lo and hi <= stop
        if inside or (snap == "outward" and lo < stop and start < hi):
            out.append(c)
    return out


def test_dates_become_the_indices_xarray_decodes_them_to(tmp_path):
    """Random CF time axes (units, reference dates, steps, integer or float values) and random
    dates, given as text, numpy.datetime64 or datetime: each bound is the first sample at or
    after it on xarray's decode of the same coordinate, and each split the chunks the model
    says."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(11)
    path = tmp_path / "times.zarr"
    root = zarr.open_group(path, mode="w", zarr_format=3)
    units = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}
    cases = []
    for k in range(24):
        unit = list(units)[rng.integers(len(units))]
        n = int(rng.integers(8, 60))
        spc = int(rng.integers(1, 7))
        step = int(rng.integers(1, 5))  # in units; floats in quarters of a unit
        if rng.random() < 0.5:
            dtype, values = "int64", np.arange(n) * step + int(rng.integers(-1000, 1000))
        else:
            dtype, values = "float64", (np.arange(n) * step + int(rng.integers(-1000, 1000))) / 4
        ref = f"{rng.integers(1950, 2030)}-{rng.integers(1, 13):02d}-{rng.integers(1, 29):02d}"
        t = root.create_array(f"t{k}", shape=(n,), chunks=(5,), dtype=dtype, dimension_names=[f"t{k}"])
        t[...] = values
        t.attrs.update({"units": f"{unit} since {ref}", "calendar": "proleptic_gregorian"})
        root.create_array(f"v{k}", shape=(n, 2), chunks=(spc, 2), dtype="float32",
                          dimension_names=[f"t{k}", "x"])[...] = 0
        cases.append((k, n, spc))
    decoded = xr.open_zarr(path, consolidated=False)
    geoms = isb.open_geometries(path)
    forms = [
        lambda t: str(t.astype("datetime64[s]")),
        lambda t: str(t.astype("datetime64[s]")).replace("T", " "),
        lambda t: t.astype("datetime64[s]"),
        lambda t: t.astype("datetime64[s]").astype(datetime.datetime),
    ]
    checked = 0
    for k, n, spc in cases:
        times = decoded[f"t{k}"].values
        span = (times[-1] - times[0]).astype("timedelta64[s]").astype(np.int64)
        for trial in range(6):
            # Two dates somewhere around the axis (before it and after it too), to the second.
            offs = np.sort(rng.integers(-span // 4, span + span // 4, 2))
            dates = [(times[0].astype("datetime64[s]") + np.timedelta64(int(o), "s")) for o in offs]
            if trial % 3 == 0:  # sometimes exactly a sample's time
                dates[0] = times[rng.integers(n)].astype("datetime64[s]")
            want = [int(np.searchsorted(times, d.astype(times.dtype))) for d in dates]
            if want[0] >= want[1]:
                continue
            form = forms[trial % len(forms)]
            snap = ("inward", "outward")[trial % 2]
            bounds = (form(dates[0]), form(dates[1]))
            expect = chunks_of(want[0], want[1], n, spc, snap)
            if not expect:
                with pytest.raises(isb.InvalidArgument, match="holds no whole chunk"):
                    isb.split_by_ranges(geoms[f"v{k}"], {"val": bounds}, snap=snap)
                continue
            m = isb.split_by_ranges(geoms[f"v{k}"], {"val": bounds}, snap=snap)
            assert m.ranges == {"val": tuple(want)}, (k, bounds)
            assert m.splits == {"val": expect}, (k, bounds, snap)
            checked += 1
    assert checked > 60


def test_a_dataset_over_ranges_yields_each_splits_samples_as_zarr_python_reads_them(fixtures):
    out, _ = fixtures
    store = out / "era5_v3.zarr"  # t2m: 12 samples in chunks of 4
    g = isb.open_geometries(store)["t2m"]
    ref = zarr.open_array(store / "t2m", mode="r")[...]
    m = isb.split_by_ranges(g, {"train": (0, 8), "test": (8, 12)})
    assert m.ranges == {"train": (0, 8), "test": (8, 12)}
    back = isb.SplitManifest.from_json(m.to_json())
    with isb.InSituDataset(store, back, {"t": g}, batch_size=3) as ds:
        for split, want in (("train", range(0, 8)), ("test", range(8, 12))):
            seen = []
            for b in getattr(ds, split):
                np.testing.assert_array_equal(b.arrays["t"], ref[b.sample_indices])
                seen += list(b.sample_indices)
            assert sorted(seen) == list(want), split
        with pytest.raises(isb.InvalidArgument, match="give `val` a range"):
            list(ds.val)
    # A bound inside a chunk, as each snap treats it.
    with pytest.raises(isb.InvalidArgument, match=r"sample 6 falls inside chunk 1 \(samples 4..8\)"):
        isb.split_by_ranges(g, {"train": (0, 6)})
    assert isb.split_by_ranges(g, {"train": (0, 6)}, snap="inward").splits == {"train": [0]}
    assert isb.split_by_ranges(g, {"train": (0, 6)}, snap="outward").splits == {"train": [0, 1]}
    with pytest.raises(isb.InvalidArgument, match="would both take chunk 1"):
        isb.split_by_ranges(g, {"train": (0, 6), "val": (6, 12)}, snap="outward")
    # The fixture's time has no units: a date cannot be placed on it.
    with pytest.raises(isb.InvalidArgument, match="give sample indices"):
        isb.split_by_ranges(g, {"train": ("1979-01-01", 8)})


def test_bad_ranges_are_refused_by_name(fixtures):
    out, _ = fixtures
    g = isb.open_geometries(out / "era5_v3.zarr")["t2m"]
    with pytest.raises(TypeError, match="`ranges` must map split names"):
        isb.split_by_ranges(g, [("train", (0, 4))])
    with pytest.raises(TypeError, match=r"`ranges\['train'\]` must be \(start, stop\)"):
        isb.split_by_ranges(g, {"train": 4})
    with pytest.raises(TypeError, match="sample indices \\(int\\) or dates"):
        isb.split_by_ranges(g, {"train": (0.0, 4)})
    with pytest.raises(isb.InvalidArgument, match="`snap`"):
        isb.split_by_ranges(g, {"train": (0, 4)}, snap="sideways")
    with pytest.raises(isb.InvalidArgument, match="NaT"):
        isb.split_by_ranges(g, {"train": (np.datetime64("NaT"), 4)})
    with pytest.raises(isb.InvalidArgument, match="to the second"):
        isb.split_by_ranges(g, {"train": (np.datetime64("2000-01-01T00:00:00.5"), 4)})
    with pytest.raises(isb.InvalidArgument, match="must be at least 0"):
        isb.split_by_ranges(g, {"train": (-1, 4)})
    with pytest.raises(isb.InvalidArgument, match="overlap"):
        isb.split_by_ranges(g, {"train": (0, 8), "val": (4, 12)})
    with pytest.raises(isb.InvalidArgument, match="train, val or test"):
        isb.split_by_ranges(g, {"holdout": (0, 4)})
    with pytest.raises(isb.InvalidArgument, match="need start < stop <= 12"):
        isb.split_by_ranges(g, {"train": (4, 16)})
    with pytest.raises(TypeError, match="ArrayGeometry"):
        isb.split_by_ranges("t2m", {"train": (0, 4)})


def test_the_period_example_in_the_python_docs_splits_by_year(tmp_path, python_docs_example):
    """docs/python-api.md, "Splitting by period", run as printed over monthly means from 1979 to
    2018 stored a year per chunk, so that its year boundaries are chunk boundaries."""
    from pathlib import Path

    code = python_docs_example("## Splitting by period")
    path = tmp_path / "monthly.zarr"
    root = zarr.open_group(path, mode="w", zarr_format=3)
    months = np.arange("1979-01", "2019-01", dtype="datetime64[M]")
    days = (months.astype("datetime64[D]") - np.datetime64("1979-01-01")).astype(np.int64)
    t = root.create_array("time", shape=days.shape, chunks=(100,), dtype="int64",
                          dimension_names=["time"])
    t[...] = days
    t.attrs.update({"units": "days since 1979-01-01", "calendar": "proleptic_gregorian"})
    root.create_array("t2m", shape=(len(days), 2, 3), chunks=(12, 2, 3), dtype="float32",
                      dimension_names=["time", "lat", "lon"])[...] = 1
    scope: dict = {}
    exec(code.replace("/data/era5.zarr", str(path)), scope)
    m, ds = scope["manifest"], scope["ds"]
    assert m.splits == {"train": list(range(37)), "val": [37], "test": [38, 39]}
    assert m.ranges == {"train": (0, 444), "val": (444, 456), "test": (456, 480)}
    years = months.astype("datetime64[Y]").astype(int) + 1970
    for split, lo, hi in (("train", 1979, 2015), ("val", 2016, 2016), ("test", 2017, 2018)):
        got = np.sort(np.concatenate([b.sample_indices for b in getattr(ds, split)]))
        np.testing.assert_array_equal(got, np.flatnonzero((years >= lo) & (years <= hi)))
    ds.close()


def test_a_sample_stride_draws_the_hours_asked_for_in_every_split(tmp_path):
    """Two days of hourly samples in daily chunks: a stride of 12 from phase 0 draws 00 and 12
    UTC, from phase 6 draws 06 and 18 UTC, in a date-split's every split, windows reading the
    hours after them; values as zarr-python reads them."""
    path = tmp_path / "hourly.zarr"
    root = zarr.open_group(path, mode="w", zarr_format=3)
    t = root.create_array("time", shape=(48,), chunks=(48,), dtype="int64", dimension_names=["time"])
    t[...] = np.arange(48)
    t.attrs.update({"units": "hours since 2020-01-01", "calendar": "standard"})
    a = root.create_array("t2m", shape=(48, 2, 3), chunks=(24, 2, 3), dtype="float32",
                          dimension_names=["time", "lat", "lon"])
    a[...] = np.arange(48 * 6, dtype="float32").reshape(48, 2, 3)
    ref = a[...]
    g = isb.open_geometries(path)["t2m"]
    m = isb.split_by_ranges(g, {"train": ("2020-01-01", "2020-01-02"),
                                "val": ("2020-01-02", "2020-01-03")})
    for phase, hours in ((0, {0, 12}), (6, {6, 18})):
        with isb.InSituDataset(path, m, {"x": g, "y": g.shift(3)}, batch_size=3,
                               sample_stride=12, sample_phase=phase) as ds:
            times = ds.coordinates("x")
            for split, day in (("train", 1), ("val", 2)):
                view = getattr(ds, split)
                assert len(view) == 1 and view.n_samples == 2, split
                drawn = []
                for b in view:
                    np.testing.assert_array_equal(b.arrays["x"], ref[b.sample_indices])
                    np.testing.assert_array_equal(b.arrays["y"], ref[b.sample_indices + 3])
                    drawn += list(b.sample_indices)
                when = times[sorted(drawn)]
                assert {int(h) for h in when.astype("datetime64[h]").astype(int) % 24} == hours
                assert set(when.astype("datetime64[D]")) == {np.datetime64(f"2020-01-0{day}")}
            assert np.array_equal(np.sort(ds.order("val").sample_indices),
                                  np.array([24 + phase, 36 + phase]))
            assert "every 12th sample" in repr(ds)
    with pytest.raises(isb.InvalidArgument, match="`sample_phase`"):
        isb.InSituDataset(path, sample_stride=12, sample_phase=12)
    with pytest.raises(isb.InvalidArgument, match="`sample_stride`"):
        isb.InSituDataset(path, sample_stride=0)
    with pytest.raises(TypeError, match="`sample_stride` must be an int"):
        isb.InSituDataset(path, sample_stride=2.0)


def test_the_end_to_end_example_in_the_python_docs_trains_on_its_years(tmp_path, python_docs_example):
    """docs/python-api.md, "A forecast model's data, end to end", run as printed over three
    years of 6-hourly synthetic fields (1979 to 1981), with 1980 as its training period and
    1981 as its validation year: every batch's inputs are the standardized fields at t - 6 h
    and t and the wind at t, its target the field at t + 6 h, all from the right years."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    code = python_docs_example("## A forecast model's data, end to end")
    store = tmp_path / "era5.zarr"
    samples = (365 + 366 + 365) * 4
    subprocess.run([str(root / "target" / "release" / "insitubatch"), "make-dataset", str(store),
                    "--samples", str(samples), "--grid", "3x4", "--sample-chunk", "4"],
                   check=True, capture_output=True)
    code = (code.replace("/data/era5.zarr", str(store)).replace("1979-01-01", "1980-01-01")
            .replace("2016-01-01", "1981-01-01").replace("2017-01-01", "1982-01-01"))
    seen: dict = {"train": [], "val": []}
    code = code.replace("        ...                                                       # a training step",
                        "        seen['train'].append((b, inputs, target))")
    code = code.replace("        ...                                                       # validation, in time order",
                        "        seen['val'].append(b)")
    scope = {"seen": seen}
    exec(code, scope)
    ds, stats = scope["ds"], scope["stats"]
    t2m = zarr.open_array(store / "t2m", mode="r")[...].astype(np.float64)
    u10 = zarr.open_array(store / "u10", mode="r")[...].astype(np.float64)
    train = np.arange(365 * 4, 731 * 4)                 # 1980, a leap year
    np.testing.assert_allclose(stats["t2m"].mean, t2m[train].mean(), rtol=1e-12)
    mean_t, std_t = stats["t2m"].mean, stats["t2m"].std
    mean_u, std_u = stats["u10"].mean, stats["u10"].std
    drawn = []
    for b, inputs, target in seen["train"][-4:]:
        rows = b.sample_indices
        drawn += list(rows)
        assert inputs.shape == (len(b), 3, 3, 4) and target.shape == (len(b), 3, 4)
        np.testing.assert_allclose(inputs[:, 0], (t2m[rows - 1] - mean_t) / std_t, atol=1e-5)
        np.testing.assert_allclose(inputs[:, 1], (t2m[rows] - mean_t) / std_t, atol=1e-5)
        np.testing.assert_allclose(inputs[:, 2], (u10[rows] - mean_u) / std_u, atol=1e-5)
        np.testing.assert_allclose(target, (t2m[rows + 1] - mean_t) / std_t, atol=1e-5)
    last_epoch = [b for b, _, _ in seen["train"][len(seen["train"]) // 2:]]
    got = np.sort(np.concatenate([b.sample_indices for b in last_epoch]))
    np.testing.assert_array_equal(got, train)
    val = np.concatenate([b.sample_indices for b in seen["val"][len(seen["val"]) // 2:]])
    # 1981 in time order, but its last sample, whose t + 6 h is past the array.
    np.testing.assert_array_equal(val, np.arange(731 * 4, 1096 * 4 - 1))
    ds.close()
