"""`InSituDataset.statistics`: a split's statistics equal numpy's over zarr-python's values at
the samples the split yields, and a `Standardize` fitted from them standardizes that split."""

import numpy as np
import pytest
import zarr

import insitubatch as isb


def test_statistics_are_numpys_over_the_splits_samples(fixtures):
    out, _ = fixtures
    store = out / "era5_v3.zarr"
    g = isb.open_geometries(store)
    t2m = zarr.open_array(store / "t2m", mode="r")[...].astype(np.float64)
    station = zarr.open_array(store / "station", mode="r")[...].astype(np.float64)
    m = isb.split_by_ranges(g["t2m"], {"train": (0, 8), "val": (8, 12)})
    with isb.InSituDataset(store, m, {"x": g["t2m"], "y": g["t2m"].shift(1),
                                      "station": g["station"]}, batch_size=3) as ds:
        for split in ("train", "val"):
            rows = np.sort(ds.order(split).sample_indices)
            whole = ds.statistics(split)
            x = whole["x"]
            assert x.axis is None and x.count == len(rows) * 9 * 16 and x.nan_count == 0
            np.testing.assert_allclose(x.mean, t2m[rows].mean(), rtol=1e-12)
            np.testing.assert_allclose(x.std, t2m[rows].std(), rtol=1e-9)
            assert (x.min, x.max) == (t2m[rows].min(), t2m[rows].max())
            np.testing.assert_allclose(whole["y"].mean, t2m[rows + 1].mean(), rtol=1e-12)
            # Per latitude (inner axis 0); the station series has no such axis: taken whole.
            per_lat = ds.statistics(split, axis=0)
            np.testing.assert_allclose(per_lat["x"].mean, t2m[rows].mean(axis=(0, 2)), rtol=1e-12)
            np.testing.assert_allclose(per_lat["x"].std, t2m[rows].std(axis=(0, 2)), rtol=1e-9)
            assert per_lat["x"].count.tolist() == [len(rows) * 16] * 9
            assert per_lat["station"].axis is None
            np.testing.assert_allclose(per_lat["station"].mean, station[rows].mean(), rtol=1e-12)
        with pytest.raises(isb.InvalidArgument, match="`axis`"):
            ds.statistics("train", axis=5)
        with pytest.raises(isb.InvalidArgument, match="give `test` a range"):
            ds.statistics("test")


def test_a_standardize_fitted_on_train_standardizes_it(fixtures):
    out, _ = fixtures
    store = out / "era5_v3.zarr"
    with isb.InSituDataset(store, geometries={"t2m": isb.open_geometries(store)["t2m"]}) as ds:
        fitted = ds.statistics("train", axis=0)["t2m"]
    t = fitted.standardize(["t2m"])
    with isb.InSituDataset(store, geometries={"t2m": isb.open_geometries(store)["t2m"]},
                           chunk_transforms=[t]) as ds:
        after = ds.statistics("train", axis=0)["t2m"]
    np.testing.assert_allclose(after.mean, 0.0, atol=1e-5)
    np.testing.assert_allclose(after.std, 1.0, rtol=1e-5)
    # Kept beside a model as JSON, read back the same.
    back = isb.Statistics.from_json(fitted.to_json())
    assert back.axis == 0
    for field in ("count", "nan_count", "mean", "std", "min", "max"):
        np.testing.assert_array_equal(getattr(back, field), getattr(fitted, field))
    with pytest.raises(isb.InvalidArgument, match="not statistics JSON"):
        isb.Statistics.from_json('{"axis": 0}')
    flat = isb.Statistics(None, 4, 0, 1.0, 0.0, 1.0, 1.0)
    with pytest.raises(isb.InvalidArgument, match="positive, finite"):
        flat.standardize()


def test_nan_is_counted_apart(tmp_path):
    path = tmp_path / "gaps.zarr"
    a = zarr.create_array(path, shape=(6, 4), chunks=(2, 4), dtype="float32", zarr_format=3)
    v = np.arange(24, dtype="float32").reshape(6, 4)
    v[1, 2] = v[4, 0] = np.nan
    a[...] = v
    with isb.InSituDataset(path, batch_size=4) as ds:
        s = ds.statistics("all")[""]
    assert (s.count, s.nan_count) == (22, 2)
    np.testing.assert_allclose(s.mean, np.nanmean(v.astype(np.float64)), rtol=1e-12)
    np.testing.assert_allclose(s.std, np.nanstd(v.astype(np.float64)), rtol=1e-9)


def test_the_statistics_example_in_the_python_docs_standardizes_each_level(tmp_path, python_docs_example):
    """docs/python-api.md, "Normalisation statistics", run as printed over a store with
    temperatures on 3 levels, each with its own mean and spread."""
    code = python_docs_example("## Normalisation statistics")
    path = tmp_path / "levels.zarr"
    t = zarr.create_array(path / "t", shape=(40, 3, 4, 5), chunks=(4, 3, 4, 5), dtype="float32",
                          zarr_format=3)
    rng = np.random.default_rng(3)
    t[...] = (np.array([220.0, 250.0, 285.0])[None, :, None, None]
              + np.array([2.0, 5.0, 9.0])[None, :, None, None] * rng.standard_normal((40, 3, 4, 5)))
    zarr.open_group(path, mode="a")  # the root group
    g = isb.open_geometries(path)["t"]
    scope = {"manifest": isb.split_by_ranges(g, {"train": (0, 32), "val": (32, 40)})}
    exec(code.replace("/data/era5.zarr", str(path)), scope)
    ds = scope["ds"]
    after = ds.statistics("train", axis=0)["t"]
    np.testing.assert_allclose(after.mean, 0.0, atol=1e-5)
    np.testing.assert_allclose(after.std, 1.0, rtol=1e-5)
    ds.close()


def test_quantiles_are_numpys_within_a_bucket_and_round_trip_as_json(fixtures):
    out, _ = fixtures
    store = out / "era5_v3.zarr"
    g = isb.open_geometries(store)
    t2m = zarr.open_array(store / "t2m", mode="r")[...].astype(np.float64)
    qs = (0.0, 0.01, 0.5, 0.99, 1.0)
    with isb.InSituDataset(store, None, {"x": g["t2m"]}, batch_size=3) as ds:
        rows = np.sort(ds.order("train").sample_indices)
        whole = ds.statistics("train", quantiles=qs)["x"]
        np.testing.assert_array_equal(whole.quantiles, qs)
        want = np.quantile(t2m[rows], qs)
        assert whole.quantile_values.shape == (len(qs),)
        np.testing.assert_allclose(whole.quantile_values, want, rtol=1 / 256)
        assert (whole.quantile_values[0], whole.quantile_values[-1]) == (whole.min, whole.max)
        per_lat = ds.statistics("train", axis=0, quantiles=qs)["x"]
        assert per_lat.quantile_values.shape == (9, len(qs))
        want = np.quantile(t2m[rows].transpose(1, 0, 2).reshape(9, -1), qs, axis=1).T
        np.testing.assert_allclose(per_lat.quantile_values, want, rtol=1 / 256)
        back = isb.Statistics.from_json(per_lat.to_json())
        np.testing.assert_array_equal(back.quantile_values, per_lat.quantile_values)
        np.testing.assert_array_equal(back.quantiles, per_lat.quantiles)
        # Without quantiles, none are kept.
        assert ds.statistics("train")["x"].quantile_values is None
        with pytest.raises(isb.InvalidArgument, match="`quantiles`"):
            ds.statistics("train", quantiles=(0.5, 1.5))
        with pytest.raises(isb.InvalidArgument, match="`quantiles`"):
            ds.statistics("train", quantiles=[0.5] * 65)
        with pytest.raises(TypeError, match="quantiles"):
            ds.statistics("train", quantiles=("median",))
