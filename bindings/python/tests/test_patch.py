"""Patches (`patch=`): every row of every label is zarr-python's sample cut at the row's
origin (`Batch.patch_origins`), static fields and stacks cut at the same place; origins move
every train epoch and stay in the other splits; a bad patch is refused by name."""

import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr

import insitubatch as isb
from insitubatch import errors


def stores(fixtures):
    out, _ = fixtures
    store = out / "statics.zarr"
    g = isb.open_geometries(store, ["field", "orog"])
    ref = {name: zarr.open_array(store / name, mode="r")[...] for name in g}
    return store, g, ref


def cut(a, origin, shape):
    """The window of `shape` over the last axes of `a` at `origin`."""
    lead = a.ndim - len(shape)
    return a[(slice(None),) * lead + tuple(slice(o, o + s) for o, s in zip(origin, shape))]


def test_every_row_is_zarr_python_cut_at_its_origin_for_every_label(fixtures):
    store, g, ref = stores(fixtures)
    views = {"x": g["field"], "x_next": g["field"].shift(1), "orog": g["orog"].as_static()}
    with isb.InSituDataset(store, None, views, stacks={"s": ["orog", "x"]}, patch=(4, 6),
                           batch_size=3, block_chunks=2, seed=5) as ds:
        assert ds.patch == (4, 6)
        assert ds.array_formats["s"][0] == (2, 4, 6)
        assert ds.array_formats["x_next"][0] == (4, 6)
        # What the pool holds is still the whole sample.
        assert ds.sample_formats["x"][0] == (9, 16)
        anchors = []
        for b in ds.train:
            o = b.patch_origins
            assert o.shape == (len(b), 2) and o.dtype == np.int64
            assert (o >= 0).all() and (o[:, 0] <= 9 - 4).all() and (o[:, 1] <= 16 - 6).all()
            for r, (i, a) in enumerate(zip(b.read_indices("x"), b.sample_indices)):
                np.testing.assert_array_equal(b.arrays["s"][r, 0], cut(ref["orog"], o[r], (4, 6)))
                np.testing.assert_array_equal(b.arrays["s"][r, 1], cut(ref["field"][i], o[r], (4, 6)))
                np.testing.assert_array_equal(b.arrays["x_next"][r], cut(ref["field"][i + 1], o[r], (4, 6)))
            anchors += b.sample_indices.tolist()
        assert sorted(anchors) == list(range(9))


def test_a_one_axis_patch_keeps_the_leading_axes_whole(fixtures):
    store, g, ref = stores(fixtures)
    with isb.InSituDataset(store, None, {"x": g["field"]}, patch=[5], batch_size=4,
                           shuffle=False) as ds:
        for b in ds.all:
            assert b.arrays["x"].shape == (len(b), 9, 5)
            for r, i in enumerate(b.sample_indices):
                np.testing.assert_array_equal(b.arrays["x"][r], cut(ref["field"][i], b.patch_origins[r], (5,)))


def test_a_periodic_axis_lets_a_window_run_across_its_end(fixtures):
    store, g, ref = stores(fixtures)
    with isb.InSituDataset(store, None, {"x": g["field"]}, patch=(4, 10),
                           patch_wrap=(False, True), batch_size=5) as ds:
        assert ds.patch_wrap == (False, True)
        crossed = 0
        for epoch in range(3):
            ds.set_epoch(epoch)
            for b in ds.train:
                for r, i in enumerate(b.sample_indices):
                    i0, j0 = b.patch_origins[r]
                    assert i0 + 4 <= 9 and j0 < 16
                    want = ref["field"][i][i0:i0 + 4][:, (j0 + np.arange(10)) % 16]
                    np.testing.assert_array_equal(b.arrays["x"][r], want)
                    crossed += j0 + 10 > 16
        assert crossed >= 5


def origins(ds, view):
    return {int(a): tuple(o) for b in view for a, o in zip(b.sample_indices, b.patch_origins)}


def test_origins_move_every_train_epoch_and_stay_in_other_splits(fixtures):
    store, g, _ = stores(fixtures)
    with isb.InSituDataset(store, None, {"x": g["field"]}, patch=(2, 2), seed=1) as ds:
        first_train, first_all = origins(ds, ds.train), origins(ds, ds.all)
        assert first_train == origins(ds, ds.train), "an epoch's origins are fixed"
        ds.set_epoch(1)
        second_train, second_all = origins(ds, ds.train), origins(ds, ds.all)
        assert sum(first_train[a] != second_train[a] for a in first_train) >= 5
        assert first_all == second_all
    with isb.InSituDataset(store, None, {"x": g["field"]}, seed=1) as whole:
        assert next(iter(whole.train)).patch_origins is None


def test_a_bad_patch_is_refused_naming_it(fixtures):
    store, g, _ = stores(fixtures)
    views = {"x": g["field"]}
    with pytest.raises(TypeError, match="`patch` must be a sequence of ints"):
        isb.InSituDataset(store, None, views, patch="64")
    with pytest.raises(TypeError, match="`patch\\[1\\]` must be an int"):
        isb.InSituDataset(store, None, views, patch=(3, 2.5))
    with pytest.raises(TypeError, match="`patch_wrap` must be a bool or one bool per patched axis"):
        isb.InSituDataset(store, None, views, patch=(3, 3), patch_wrap=(1, 0))
    with pytest.raises(errors.InvalidArgument, match="one wrap flag per patched axis"):
        isb.InSituDataset(store, None, views, patch=(3, 3), patch_wrap=(True,))
    with pytest.raises(errors.InvalidArgument, match="`patch_wrap` places or shapes patches, and no `patch` is set"):
        isb.InSituDataset(store, None, views, patch_wrap=True)
    with pytest.raises(errors.InvalidArgument, match="`patch\\[0\\]` = 0"):
        isb.InSituDataset(store, None, views, patch=(0, 3))
    with pytest.raises(errors.InvalidArgument, match="`patch`.*larger than the field along its axis 1: 17 against 16"):
        isb.InSituDataset(store, None, views, patch=(3, 17))
    with pytest.raises(errors.InvalidArgument, match="`patch`.*`x` has \\[9, 16\\], `o` has \\[5, 7\\]"):
        isb.InSituDataset(store, None,
                          {"x": g["field"], "o": g["orog"].as_static().crop((2, 7), (3, 10))},
                          patch=(3, 3))


def test_several_patches_per_sample_are_rows_of_their_own(fixtures):
    store, g, ref = stores(fixtures)
    with isb.InSituDataset(store, None, {"x": g["field"], "orog": g["orog"].as_static()},
                           patch=(4, 6), patches_per_sample=3, batch_size=4, seed=2) as ds:
        assert (ds.patches_per_sample, ds.patch_grid) == (3, None)
        assert ref["field"].shape == (10, 9, 16)
        assert len(ds.train) == 8  # 30 rows in batches of 4
        for epoch in range(2):
            ds.set_epoch(epoch)
            by_anchor = {}
            for b in ds.train:
                for r, (i, a) in enumerate(zip(b.read_indices("x"), b.sample_indices)):
                    o = b.patch_origins[r]
                    np.testing.assert_array_equal(b.arrays["x"][r], cut(ref["field"][i], o, (4, 6)))
                    np.testing.assert_array_equal(b.arrays["orog"][r], cut(ref["orog"], o, (4, 6)))
                    by_anchor.setdefault(int(a), []).append(tuple(o))
            assert sorted(by_anchor) == list(range(10))
            assert all(len(o) == 3 for o in by_anchor.values())
            assert sum(len(set(o)) > 1 for o in by_anchor.values()) >= 8, by_anchor


def stitch(view, label, patch, n, field):
    """Every sample's field put back together from its patches' rows (NaN where none)."""
    out = np.full((n, *field), np.nan, dtype="f4")
    for b in view:
        for r, s in enumerate(b.sample_indices):
            i0, j0 = b.patch_origins[r]
            out[s, i0:i0 + patch[0], j0:j0 + patch[1]] = b.arrays[label][r]
    return out


@pytest.mark.parametrize("grid, per_sample", [(True, 3 * 3), ((2, 3), 4 * 5)])
def test_a_grid_tiles_every_field_so_patches_stitch_back_whole(fixtures, grid, per_sample):
    store, g, ref = stores(fixtures)
    with isb.InSituDataset(store, None, {"x": g["field"]}, patch=(4, 6), patch_grid=grid,
                           batch_size=8) as ds:
        assert ds.patches_per_sample == per_sample
        assert ds.patch_grid == ((4, 6) if grid is True else grid)
        assert len(ds.all) == -(-10 * per_sample // 8)
        for view in (ds.train, ds.all):
            np.testing.assert_array_equal(stitch(view, "x", (4, 6), 10, (9, 16)), ref["field"])


def test_patches_placed_badly_are_refused_naming_the_argument(fixtures):
    store, g, _ = stores(fixtures)
    views = {"x": g["field"]}
    with pytest.raises(errors.InvalidArgument, match="`patches_per_sample` = 0"):
        isb.InSituDataset(store, None, views, patch=(3, 3), patches_per_sample=0)
    with pytest.raises(TypeError, match="`patch_grid` must be a bool or a stride"):
        isb.InSituDataset(store, None, views, patch=(3, 3), patch_grid="3x3")
    with pytest.raises(errors.InvalidArgument, match="`patch_grid`.*one stride per patched axis"):
        isb.InSituDataset(store, None, views, patch=(3, 3), patch_grid=(3,))
    with pytest.raises(errors.InvalidArgument, match="`patch_grid`.*axis 1 must be from 1 to the patch's extent there \\(3\\)"):
        isb.InSituDataset(store, None, views, patch=(3, 3), patch_grid=(3, 4))
    with pytest.raises(errors.InvalidArgument, match="both `per_sample` and `grid`"):
        isb.InSituDataset(store, None, views, patch=(3, 3), patches_per_sample=2, patch_grid=True)
    for kwargs in ({"patches_per_sample": 2}, {"patch_grid": True},
                   {"patch_grid": np.array([3, 3])}):
        with pytest.raises(errors.InvalidArgument, match="no `patch` is set"):
            isb.InSituDataset(store, None, views, **kwargs)


def test_the_patches_example_in_the_python_docs_gives_what_it_prints(tmp_path, python_docs_example):
    """docs/python-api.md, "Patches": its example as printed, on a small ERA5-like store with an
    orography added by zarr-python."""
    code = python_docs_example("## Patches")
    store = tmp_path / "era5.zarr"
    exe = Path(__file__).resolve().parents[3] / "target" / "release" / "insitubatch"
    subprocess.run([str(exe), "make-dataset", str(store), "--samples", "40", "--sample-chunk", "4"],
                   check=True, capture_output=True)
    orography = np.random.default_rng(0).normal(size=(181, 360)).astype("f4")
    zarr.open_group(store, mode="a").create_array("orography", data=orography, chunks=(91, 180))
    zarr.consolidate_metadata(store)
    scope = {"isb": isb, "store": str(store)}
    exec(code, scope)
    b, x, y, i0, j0 = (scope[k] for k in ("b", "x", "y", "i0", "j0"))
    assert x.shape == (32, 3, 64, 64) and y.shape == (32, 64, 64)
    cols = (j0 + np.arange(64)) % 360
    t2m = zarr.open_array(store / "t2m", mode="r")
    i = b.read_indices("t2m")[0]
    np.testing.assert_array_equal(x[0, 0], t2m[i][i0:i0 + 64][:, cols])
    np.testing.assert_array_equal(x[0, 2], orography[i0:i0 + 64][:, cols])
    np.testing.assert_array_equal(y[0], t2m[i + 1][i0:i0 + 64][:, cols])
    scope["ds"].close()


def test_the_tiling_example_in_the_python_docs_stitches_every_field_back(tmp_path, python_docs_example):
    """docs/python-api.md, "Several patches per sample, and tiling a field for inference": its
    example as printed, on a small ERA5-like store; the fields it puts back are zarr-python's."""
    code = python_docs_example("### Several patches per sample, and tiling a field for inference")
    store = tmp_path / "era5.zarr"
    exe = Path(__file__).resolve().parents[3] / "target" / "release" / "insitubatch"
    subprocess.run([str(exe), "make-dataset", str(store), "--samples", "12", "--sample-chunk", "4"],
                   check=True, capture_output=True)
    scope = {"isb": isb, "np": np, "store": str(store)}
    exec(code, scope)
    ds, fields = scope["ds"], scope["fields"]
    assert (ds.patches_per_sample, ds.patch_grid) == (18, (64, 64))
    np.testing.assert_array_equal(fields, zarr.open_array(store / "t2m", mode="r")[...])


def test_the_stitcher_example_in_the_python_docs_puts_every_field_back(tmp_path, python_docs_example):
    """docs/python-api.md: the `Stitcher` example as printed, after the tiling example that
    opens its dataset, with the identity as the model: every field comes back."""
    opening = python_docs_example("### Several patches per sample, and tiling a field for inference")
    code = python_docs_example("`insitubatch.tiling.Stitcher(ds, weight=None, dtype=np.float32)`")
    store = tmp_path / "era5.zarr"
    exe = Path(__file__).resolve().parents[3] / "target" / "release" / "insitubatch"
    subprocess.run([str(exe), "make-dataset", str(store), "--samples", "24", "--sample-chunk", "4"],
                   check=True, capture_output=True)
    scope = {"isb": isb, "np": np, "store": str(store), "model": lambda x: x, "forecasts": {}}
    exec(opening, scope)
    exec(code, scope)
    forecasts, ds = scope["forecasts"], scope["ds"]
    assert sorted(forecasts) == list(ds.anchor_range) == list(range(24))
    t2m = zarr.open_array(store / "t2m", mode="r")
    for s, field in forecasts.items():
        np.testing.assert_array_equal(field, t2m[s])


def test_a_field_a_window_also_reads_is_loaded_as_the_chunks_under_both_windows(tmp_path, monkeypatch):
    # x and its next sample x_next cut from the same patch: each chunk feeds rows of both
    # labels, so it goes through the pool, loaded with only the stored chunks under the windows
    # (`stats()["region_slots"]`); the values are zarr-python's either way.
    store = tmp_path / "tiles.zarr"
    rng = np.random.default_rng(3)
    data = rng.standard_normal((16, 12, 24)).astype("float32")
    a = zarr.create_array(store, name="x", shape=data.shape, chunks=(1, 3, 6), dtype="float32")
    a[...] = data
    g = isb.open_geometries(store, ["x"])

    def epoch(seed):
        views = {"x": g["x"], "x_next": g["x"].shift(1)}
        with isb.InSituDataset(store, None, views, patch=(3, 5), batch_size=4, block_chunks=2,
                               seed=seed) as ds:
            rows = []
            for b in ds.train:
                for r, a in enumerate(b.sample_indices):
                    o = b.patch_origins[r]
                    np.testing.assert_array_equal(b.arrays["x"][r], cut(data[a], o, (3, 5)))
                    np.testing.assert_array_equal(b.arrays["x_next"][r], cut(data[a + 1], o, (3, 5)))
                    rows.append(int(a))
            return sorted(rows), ds.stats()

    monkeypatch.setenv("INSITUBATCH_DECODE_INTO_BATCHES", "always")
    for seed in range(3):
        rows, s = epoch(seed)
        assert rows == list(range(15))  # the last anchor's x_next is off the array
        assert s["region_slots"] == s["cache_misses"] == 16
        # Each of the 16 fields is 4 x 4 stored chunks; two 3 x 5 windows touch at most 8.
        assert s["tiles_read"] <= 16 * 8 and s["tiles_into_batches"] == 0
