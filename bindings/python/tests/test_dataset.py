"""The engine through Python: values against zarr-python, sample-once, determinism, zero copy,
lifetimes under adversarial drop orders, errors, fork."""

import contextlib
import gc
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr

import insitubatch as isb


def era5(fixtures):
    out, _ = fixtures
    return out / "era5_v3.zarr"


def test_every_sample_equals_zarr_python_with_windows_and_each_anchor_once(fixtures):
    store = era5(fixtures)
    g = isb.open_geometries(store)
    assert set(g) == {"t2m", "u10", "station"}, "coordinates and spatial_ref are skipped"
    ref = {name: zarr.open_array(store / name, mode="r")[...] for name in ("t2m", "u10")}
    geoms = {"x": g["t2m"], "y": g["t2m"].shift(2), "u": g["u10"]}
    manifest = isb.split_by_chunk(g["t2m"], (0.5, 0.5))
    assert isb.SplitManifest.from_json(manifest.to_json()).splits == manifest.splits
    with isb.InSituDataset(store, manifest, geoms, batch_size=2, block_chunks=1) as ds:
        seen = []
        for split in (ds.train, ds.val):
            split_seen = len(seen)
            batches = 0
            for b in split:
                batches += 1
                assert b.arrays["x"].shape == (len(b), 9, 16)
                for r, idx in enumerate(b.read_indices("x")):
                    np.testing.assert_array_equal(b.arrays["x"][r], ref["t2m"][idx])
                for r, idx in enumerate(b.read_indices("y")):
                    np.testing.assert_array_equal(b.arrays["y"][r], ref["t2m"][idx])
                for r, idx in enumerate(b.read_indices("u")):
                    np.testing.assert_array_equal(b.arrays["u"][r], ref["u10"][idx])
                assert b.stack(["x", "u"], axis=1).shape == (len(b), 2, 9, 16)
                seen.extend(b.sample_indices.tolist())
            # len() of a view is its batches per epoch, known before it runs (windows included).
            assert split.n_samples == len(seen) - split_seen and len(split) == batches
        # T = 12, y reads t + 2: anchors 0..9 are valid, each exactly once across the splits.
        assert sorted(seen) == list(range(10))
        assert len(ds.all) == 5 and ds.all.n_samples == 10
        with pytest.raises(isb.InvalidArgument, match="unknown split `holdout`"):
            ds._split_len("holdout")
    with isb.InSituDataset(store, batch_size=5) as ds, pytest.raises(isb.InvalidArgument, match="split `val` is empty"):
        assert repr(ds) == f"<insitubatch.InSituDataset {str(store)!r} variables ['station', 't2m', 'u10'] batch_size 5>"
        len(ds.val)
    assert repr(ds).endswith("batch_size 5 closed>")


def test_stacked_labels_are_channels_written_in_place_equal_to_zarr_python(fixtures):
    store = era5(fixtures)
    g = isb.open_geometries(store)
    ref = {name: zarr.open_array(store / name, mode="r")[...] for name in ("t2m", "u10")}
    geoms = {"t2m": g["t2m"], "station": g["station"], "u10": g["u10"], "next": g["t2m"].shift(1)}
    stacks = {"x": ["u10", "t2m", "next"]}
    with isb.InSituDataset(store, None, geoms, batch_size=5, stacks=stacks) as ds, \
            isb.InSituDataset(store, None, geoms, batch_size=5) as own:
        assert ds.stacks == stacks
        assert ds.array_formats == {
            "x": ((3, 9, 16), np.dtype("float32")),
            "station": ((), np.dtype("float32")),
        }
        # Labels keep their per-sample formats and offsets.
        assert ds.sample_formats["next"] == ((9, 16), np.dtype("float32"))
        seen = []
        for b, o in zip(ds.train, own.train, strict=True):
            assert list(b.arrays) == ["x", "station"]
            x = b.arrays["x"]
            assert x.shape == (len(b), 3, 9, 16) and x.flags.c_contiguous
            for c, (label, name) in enumerate((("u10", "u10"), ("t2m", "t2m"), ("next", "t2m"))):
                for r, idx in enumerate(b.read_indices(label)):
                    np.testing.assert_array_equal(x[r, c], ref[name][idx])
            # The same batch the labels' own arrays give, and what Batch.stack copies together.
            np.testing.assert_array_equal(x, o.stack(["u10", "t2m", "next"]))
            np.testing.assert_array_equal(b.arrays["station"], o.arrays["station"])
            seen.extend(b.sample_indices.tolist())
        assert sorted(seen) == list(range(11))


def test_bad_stacks_are_named(fixtures):
    store = era5(fixtures)
    for stacks, error, match in (
        ({"x": ["t2m", "station"]}, isb.InvalidArgument, "one sample shape"),
        ({"x": ["t2m", "v10"]}, isb.InvalidArgument, "no label `v10`"),
        ({"t2m": ["u10"]}, isb.InvalidArgument, "already names a label"),
        ({"x": ["t2m"], "y": ["t2m"]}, isb.InvalidArgument, "already in stack `x`"),
        ({"x": []}, isb.InvalidArgument, "at least one label"),
        ({"x": "t2m"}, TypeError, "list of labels"),
        (["t2m", "u10"], TypeError, "must map each stacked array's name"),
        ({"x": ["t2m", 3]}, TypeError, "list of labels"),
    ):
        with pytest.raises(error, match=match):
            isb.InSituDataset(store, stacks=stacks)


def test_a_cropped_view_is_zarr_pythons_region_and_reads_only_the_chunks_it_touches(fixtures):
    out, _ = fixtures
    store = out / "v3_inner.zarr"  # (6, 7, 9), chunks (2, 3, 4): 3 x 3 tiles per sample chunk
    ref = zarr.open_array(store, mode="r")[...]
    g = isb.open_geometries(store)[""]  # the store's root array
    x = g.crop(slice(4, 7), (1, 3))
    assert x.region == ((4, 7), (1, 3)) and x.inner_shape == (3, 2)
    assert g.crop(slice(None), (0, 9)) == g, "a whole-field region is no crop"
    with isb.InSituDataset(store, None, {"x": x, "y": x.shift(1)}, batch_size=2) as ds:
        assert ds.geometries["x"].region == ((4, 7), (1, 3))
        assert ds.sample_formats["x"][0] == (3, 2)
        seen = []
        for b in ds.train:
            assert b.arrays["x"].shape == (len(b), 3, 2)
            for label in ("x", "y"):
                for r, idx in enumerate(b.read_indices(label)):
                    np.testing.assert_array_equal(b.arrays[label][r], ref[idx, 4:7, 1:3])
            seen.extend(b.sample_indices.tolist())
        assert sorted(seen) == list(range(5))
        # 3 sample chunks, of each the 2 tiles the region touches (of 9).
        assert ds.stats()["tiles_read"] == 3 * 2
    for bad, err, says in [
        ((slice(0, 2),), isb.InvalidArgument, "one range per field axis, 2"),
        ((slice(0, 8), slice(None)), isb.InvalidArgument, "axis 1 has length 7"),
        ((slice(3, 3), slice(None)), isb.InvalidArgument, "0 <= start < end"),
        ((slice(0, 4, 2), slice(None)), isb.InvalidArgument, "step 2"),
        (((0, 2.5), slice(None)), TypeError, "must be ints"),
        (([0, 1, 2], slice(None)), TypeError, "a slice or a \\(start, end\\) pair"),
    ]:
        with pytest.raises(err, match=says):
            g.crop(*bad)
    # Views of one array read one region: the library names both labels.
    with pytest.raises(isb.InvalidArgument, match="x and y.*same region"):
        isb.InSituDataset(store, None, {"x": x, "y": g.shift(1)})


def test_a_wrapping_crop_is_the_range_across_the_seam_in_order(fixtures):
    out, _ = fixtures
    store = out / "v3_inner.zarr"  # (6, 7, 9), chunks (2, 3, 4)
    ref = zarr.open_array(store, mode="r")[...]
    g = isb.open_geometries(store)[""]
    # The last 2 and first 2 rows of y; x from 7 on across its end (length 9) to 3.
    x = g.crop(slice(-2, 2), (7, 12), wrap=True)
    assert x.region == ((5, 9), (7, 12)) and x.inner_shape == (4, 5) and x.wraps
    assert g.crop((5, 9), slice(-2, 3), wrap=True) == x
    assert g.crop(slice(1, 3), slice(None), wrap=True) == g.crop(slice(1, 3), slice(None))
    assert not g.crop(slice(1, 3), slice(None)).wraps
    rows = [5, 6, 0, 1]
    cols = [7, 8, 0, 1, 2]
    with isb.InSituDataset(store, None, {"x": x}, batch_size=2) as ds:
        assert ds.geometries["x"].region == ((5, 9), (7, 12))
        seen = []
        for b in ds.train:
            assert b.arrays["x"].shape == (len(b), 4, 5)
            for r, idx in enumerate(b.read_indices("x")):
                np.testing.assert_array_equal(b.arrays["x"][r], ref[idx][np.ix_(rows, cols)])
            seen.extend(b.sample_indices.tolist())
        assert sorted(seen) == list(range(6))
        # Per sample chunk, tiles 1, 2, 0 along y and 1, 2, 0 along x: each once.
        assert ds.stats()["tiles_read"] == 3 * 3 * 3
    for bad, wrap, says in [
        ((slice(-2, 2), slice(None)), False, "needs wrap=True"),
        ((slice(0, 8), slice(None)), False, "needs wrap=True"),
        ((slice(-2, 6), slice(None)), True, "start < end <= start \\+ 7"),
        ((slice(-8, 0), slice(None)), True, "-7 <= start < 7"),
    ]:
        with pytest.raises(isb.InvalidArgument, match=says):
            g.crop(*bad, wrap=wrap)
    with pytest.raises(TypeError, match="wrap must be a bool"):
        g.crop(slice(0, 2), slice(None), wrap=1)


def test_a_crop_in_coordinate_values_reads_the_indices_whose_values_lie_in_it(fixtures):
    # ERA5-like groups, v3 (dimension_names) and v2 (_ARRAY_DIMENSIONS, unconsolidated):
    # latitude falls from 90 by 22.5 (9 values), longitude rises from 0 by 22.5 (16).
    out, _ = fixtures
    for name in ("era5_v3.zarr", "era5_v2.zarr"):
        store = out / name
        ref = zarr.open_array(store / "t2m", mode="r")[...]
        lat = zarr.open_array(store / "latitude", mode="r")[...]
        lon = zarr.open_array(store / "longitude", mode="r")[...]
        g = isb.open_geometries(store)["t2m"]
        # 67.5N .. 0 and 25W .. 45E, across 0 longitude.
        europe = g.crop_coords(latitude=(67.5, 0), longitude=(-25, 45), periodic={"longitude": 360})
        assert europe == g.crop((1, 5), (15, 19), wrap=True), name
        assert g.crop_coords({"latitude": (0, 67.5)}, longitude=(335, 45),
                             periodic={"longitude": 360}) == europe
        rows = np.flatnonzero((lat <= 67.5) & (lat >= 0))
        cols = [15, 0, 1, 2]  # 337.5, then 0, 22.5 and 45 in that order
        assert lon[cols].tolist() == [337.5, 0, 22.5, 45]
        with isb.InSituDataset(store, None, {"x": europe}, batch_size=5) as ds:
            seen = 0
            for b in ds.train:
                for r, idx in enumerate(b.read_indices("x")):
                    np.testing.assert_array_equal(b.arrays["x"][r], ref[idx][np.ix_(rows, cols)])
                    seen += 1
            assert seen == 12
        # The same as a region for C-style callers; axes not named stay whole.
        assert isb.coordinate_region(store, "t2m", {"longitude": (50, 100)}) == (((0, 9), (3, 5)), False)
        with pytest.raises(isb.InvalidArgument, match="`level` is not a dimension"):
            g.crop_coords(level=(0, 1))
        with pytest.raises(isb.InvalidArgument, match="`time` is the sample axis"):
            g.crop_coords(time=(0, 6))
        with pytest.raises(isb.InvalidArgument, match="no coordinate lies between 10 and 20"):
            g.crop_coords(latitude=(10, 20))
        with pytest.raises(isb.InvalidArgument, match="`periodic` names `longitude`"):
            g.crop_coords(latitude=(0, 10), periodic={"longitude": 360})
        with pytest.raises(TypeError, match=r"bounds\['latitude'\] must be a pair"):
            g.crop_coords(latitude=10)
        with pytest.raises(TypeError, match="given twice"):
            g.crop_coords({"latitude": (0, 1)}, latitude=(0, 2))


def test_the_coordinate_crop_example_in_the_python_docs_gives_the_region_it_prints(tmp_path, python_docs_example):
    """docs/python-api.md, "In coordinate values": its example as printed, on a 0.25° global
    grid (latitudes falling from 90, longitudes from 0) of its own."""
    code = python_docs_example("**In coordinate values.**")
    path = tmp_path / "era5_0p25.zarr"
    g = zarr.open_group(path, mode="w", zarr_format=3)
    for name, values in (("latitude", np.linspace(90, -90, 721)), ("longitude", np.arange(1440) * 0.25)):
        g.create_array(name, shape=values.shape, dtype="float64",
                       dimension_names=[name])[...] = values
    g.create_array("t2m", shape=(2, 721, 1440), chunks=(1, 721, 1440), dtype="float32",
                   dimension_names=["time", "latitude", "longitude"])[...] = 0
    scope = {"isb": isb, "store": str(path)}
    exec(code, scope)
    assert (scope["europe"].region, scope["europe"].wraps) == (((72, 221), (1340, 1621)), True)


def test_the_channels_example_in_the_python_docs_gives_the_shapes_it_prints(tmp_path, python_docs_example):
    """docs/python-api.md, "Variables as channels": its example as printed, on a small ERA5-like
    store of the three variables it names, at the grid it prints."""
    code = python_docs_example("## Variables as channels")
    store = tmp_path / "era5.zarr"
    exe = Path(__file__).resolve().parents[3] / "target" / "release" / "insitubatch"
    subprocess.run([str(exe), "make-dataset", str(store), "--samples", "40", "--sample-chunk", "4",
                    "--variables", "t2m,u10,v10"], check=True, capture_output=True)
    scope = {"isb": isb, "store": str(store)}
    exec(code, scope)
    b, x, y = scope["b"], scope["x"], scope["y"]
    assert x.shape == (32, 4, 181, 360) and y.shape == (32, 181, 360)
    ref = {v: zarr.open_array(store / v, mode="r") for v in ("t2m", "u10", "v10")}
    for c, (label, var) in enumerate((("t2m_prev", "t2m"), ("t2m", "t2m"), ("u10", "u10"), ("v10", "v10"))):
        idx = b.read_indices(label)
        np.testing.assert_array_equal(x[:, c], ref[var].oindex[idx])
    scope["ds"].close()


def test_memory_need_counts_the_batches_and_pool_a_pass_holds_before_it_runs(fixtures):
    out, _ = fixtures
    store = out / "paired.zarr"
    g = isb.open_geometries(store, ["raw", "mask"])
    with isb.InSituDataset(store, None, g, batch_size=7, block_chunks=2, prefetch_depth=1) as ds:
        need = ds.memory_need("train")
        sample = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in ds.sample_formats.values())
        assert need["batch_bytes"] == 7 * sample
        assert need["batches"] == min(1 + 2, len(ds.train))
        assert need["pool_bytes"] == need["working_set_bytes"] and need["cache_budget_bytes"] is None
        assert (need["others_bytes"], need["other_passes"]) == (0, 0), "no iteration is running"
        parts = need["pool_bytes"] + need["batches"] * need["batch_bytes"] + need["read_bytes"]
        assert need["total_bytes"] == parts + need["overhead_bytes"]
        assert need["overhead_bytes"] == (16 << 20) + parts // 8
        assert need["fits"] and need["limit_bytes"] >= need["total_bytes"]
        assert need["limit_source"] in ("machine", "cgroup", "ulimit -v")
        assert need["process_rss_bytes"] > 16 << 20, "the interpreter and numpy alone are more"
        assert sum(len(b) for b in ds.train) == 61
        assert ds.stats()["pool"]["peak_resident_bytes"] <= need["pool_bytes"]
        with pytest.raises(isb.InvalidArgument, match="unknown split `holdout`"):
            ds.memory_need("holdout")
        with pytest.raises(TypeError, match="split must be a str"):
            ds.memory_need(0)
    # A heap budget above the working set is held too, up to every chunk of the arrays.
    thirds = isb.split_by_chunk(g["raw"], (0.5, 0.25, 0.25))
    with isb.InSituDataset(store, thirds, g, batch_size=7, block_chunks=2, cache_budget_bytes=1 << 40) as ds:
        big = ds.memory_need("train")
        assert big["cache_budget_bytes"] == 1 << 40
        assert need["working_set_bytes"] < big["pool_bytes"] < 1 << 40
        assert big["total_bytes"] > need["total_bytes"]
        # Zipped beside a running train iteration, val needs room for train's batches too (the
        # pool, which holds both working sets, and the read buffers are shared).
        alone = ds.memory_need("val")
        it = iter(ds.train)
        next(it)
        beside = ds.memory_need("val")
        train = ds.memory_need("train")
        assert beside["other_passes"] == 1 and train["other_passes"] == 1
        assert beside["others_bytes"] == train["batches"] * train["batch_bytes"]
        parts = beside["pool_bytes"] + beside["batches"] * beside["batch_bytes"] + beside["read_bytes"]
        assert beside["total_bytes"] == parts + beside["others_bytes"] + beside["overhead_bytes"]
        assert beside["total_bytes"] > alone["total_bytes"]
        assert sum(len(v) for _, v in zip(it, ds.val)) > 0
        it.close()
        assert ds.memory_need("val")["others_bytes"] == 0, "a closed iterator holds nothing"


def test_memory_limit_bytes_caps_what_the_dataset_may_hold(fixtures):
    out, _ = fixtures
    store = out / "paired.zarr"
    g = isb.open_geometries(store, ["raw"])
    with isb.InSituDataset(store, None, g, batch_size=7, memory_limit_bytes=1 << 20) as ds:
        need = ds.memory_need("train")
        assert (need["limit_source"], need["limit_bytes"]) == ("memory_limit_bytes", 1 << 20)
        assert not need["fits"], "the library's own 16 MiB alone is more"
        with pytest.raises(isb.InvalidArgument, match="1048576 bytes of memory_limit_bytes"):
            next(iter(ds.train))
    with isb.InSituDataset(store, None, g, batch_size=7, memory_limit_bytes=1 << 30) as ds:
        assert ds.memory_need("train")["fits"]
        assert sum(len(b) for b in ds.train) == 61
    with pytest.raises(isb.InvalidArgument, match="`memory_limit_bytes` = 0"):
        isb.InSituDataset(store, memory_limit_bytes=0)
    with pytest.raises(TypeError, match="`memory_limit_bytes` must be an int"):
        isb.InSituDataset(store, memory_limit_bytes=1.5e9)


def test_ranks_share_every_split_and_train_evenly(fixtures):
    # Two data-parallel ranks as torchrun would start them, each with its own dataset: the mask's
    # grid has chunks of 30, 30 and 1 samples, so rank 0 holds chunk 0 (30) and rank 1 the rest (31).
    out, _ = fixtures
    store = out / "paired.zarr"
    g = isb.open_geometries(store, ["raw", "mask"])
    manifest = isb.split_by_chunk(g["mask"], (1.0,))
    ref = zarr.open_array(store / "raw", mode="r")[...]
    train, every = [], []
    for rank in range(2):
        with isb.InSituDataset(store, manifest, g, batch_size=4, seed=3, rank=rank, world_size=2) as ds:
            assert (len(ds.train), ds.train.n_samples) == (8, 30)
            assert repr(ds).endswith(f"batch_size 4 rank {rank} of 2>") and ds.rank == rank
            rows = []
            for b in ds.train:
                for r, idx in enumerate(b.read_indices("raw")):
                    np.testing.assert_array_equal(b.arrays["raw"][r], ref[idx])
                rows.extend(b.sample_indices.tolist())
            assert len(rows) == 30
            # Rank 1's share is chunks 1 and 2 (31 samples): one left out, a different one each epoch.
            assert ds.stats()["trimmed_rows"] == rank
            train.extend(rows)
            every.extend(i for b in ds.all for i in b.sample_indices.tolist())
    assert len(set(train)) == 60, "no sample on both ranks"
    # Without evening out, rank 1's train pass is its whole share (chunks 1 and 2).
    with isb.InSituDataset(store, manifest, g, seed=3, rank=1, world_size=2, even_train=False) as ds:
        assert ds.train.n_samples == 31
        assert sorted(i for b in ds.train for i in b.sample_indices.tolist()) == list(range(30, 61))
    with pytest.raises(TypeError, match="`even_train` must be a bool"):
        isb.InSituDataset(store, even_train=1)
    assert sorted(every) == list(range(61))
    with pytest.raises(isb.InvalidArgument, match="`rank` = 2: must be below world_size = 2"):
        isb.InSituDataset(store, rank=2, world_size=2)
    with pytest.raises(isb.InvalidArgument, match="`world_size` = 0"):
        isb.InSituDataset(store, world_size=0)
    with isb.InSituDataset(store, manifest, g, world_size=4) as ds:
        with pytest.raises(isb.InvalidArgument, match="split `train` has 3 chunks"):
            len(ds.train)


def test_order_depends_on_seed_and_epoch_only(fixtures):
    out, _ = fixtures
    store = out / "paired.zarr"
    g = isb.open_geometries(store, ["raw", "mask"])

    def order(threads, io, epoch):
        with isb.InSituDataset(store, None, g, batch_size=7, block_chunks=4, seed=3,
                               executor_threads=threads, io_backend=io) as ds:
            ds.set_epoch(epoch)
            return [i for b in ds.train for i in b.sample_indices.tolist()]

    a = order(1, "threads", 0)
    assert a == order(2, "auto", 0)
    b = order(2, "auto", 1)
    assert a != b and sorted(a) == sorted(b) == list(range(61))
    assert isb.shuffle_quality(a, 1) > 0.5
    assert isb.shuffle_quality(list(range(64)), 8) < 0.1


def checked_train_epochs(ds, epochs, name, ref):
    """Iterates train at each of `epochs`, checking every row of `name` against `ref`: per
    epoch, its batches' sample indices and the iteration's stats."""
    out = []
    for epoch in epochs:
        ds.set_epoch(epoch)
        batches = []
        for b in ds.train:
            for r, idx in enumerate(b.read_indices(name)):
                np.testing.assert_array_equal(b.arrays[name][r], ref[idx])
            batches.append(b.sample_indices.tolist())
        out.append((batches, ds.stats()))
    return out


def test_fast_first_batch_draws_each_epochs_first_batch_from_one_batchs_chunks(fixtures):
    store = era5(fixtures)
    g = isb.open_geometries(store, ["t2m"])
    ref = zarr.open_array(store / "t2m", mode="r")[...]

    def epochs(fast):
        # 12 samples in chunks of 4, batches of 3: with the ramp the first block is one chunk.
        with isb.InSituDataset(store, None, g, batch_size=3, block_chunks=3, fast_first_batch=fast) as ds:
            return [batches for batches, _ in checked_train_epochs(ds, range(4), "t2m", ref)]

    fast, plain = epochs(True), epochs(False)
    for f, p in zip(fast, plain):
        assert sorted(sum(f, [])) == sorted(sum(p, [])) == list(range(12))
        assert len({i // 4 for i in f[0]}) == 1, f
    assert any(len({i // 4 for i in p[0]}) > 1 for p in plain), plain
    with pytest.raises(TypeError, match="`fast_first_batch` must be a bool"):
        isb.InSituDataset(store, fast_first_batch="yes")


def test_prefetch_next_epoch_hands_over_the_epoch_asked_for_started_early(fixtures):
    out, _ = fixtures
    store = out / "paired.zarr"
    g = isb.open_geometries(store, ["raw"])
    ref = zarr.open_array(store / "raw", mode="r")[...]

    def epochs(early, order, **knobs):
        with isb.InSituDataset(store, None, g, batch_size=4, seed=5, prefetch_next_epoch=early,
                               **knobs) as ds:
            return [(batches, stats["started_ahead"], stats["tiles_into_batches"])
                    for batches, stats in checked_train_epochs(ds, order, "raw", ref)]

    # Epochs in a row are started early; epoch 7 after 2 is not (the early one was epoch 3).
    # Once with a budget that holds two iterations, once with the automatic one (a block long
    # enough that chunks are kept in the pool rather than decoded into rows): the early pass
    # then takes over the running one's room, and nothing warns.
    order = [0, 1, 2, 7, 8]
    for knobs in (dict(block_chunks=3, cache_budget_bytes=1 << 24), dict(block_chunks=16)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            early, plain = epochs(True, order, **knobs), epochs(False, order, **knobs)
        assert [a for _, a, _ in early] == [False, True, True, False, True], knobs
        assert not any(a for _, a, _ in plain)
        assert [b for b, _, _ in early] == [b for b, _, _ in plain], "the same batches in order"
        assert sorted(sum(early[1][0], [])) == list(range(61))
        if "cache_budget_bytes" not in knobs:
            assert all(t == 0 for _, _, t in early), "through the pool"
    with pytest.raises(TypeError, match="`prefetch_next_epoch` must be a bool"):
        isb.InSituDataset(store, prefetch_next_epoch=1)


def test_prefetched_epoch_names_the_epoch_waiting_to_be_asked_for(fixtures):
    out, _ = fixtures
    store = out / "paired.zarr"
    g = isb.open_geometries(store, ["raw"])

    def waiting(ds):
        # The early epoch is started by a thread of its own once the last chunk is loaded.
        deadline = time.monotonic() + 10
        while ds.prefetched_epoch is None and time.monotonic() < deadline:
            time.sleep(0.001)
        return ds.prefetched_epoch

    for early in (True, False):
        with isb.InSituDataset(store, None, g, batch_size=4, seed=5, prefetch_next_epoch=early) as ds:
            assert ds.prefetched_epoch is None
            seen = []
            for epoch in (0, 1, 5):  # epoch 5 drops the early epoch 2 and starts 6
                ds.set_epoch(epoch)
                assert sum(len(b) for b in ds.train) == 61
                seen.append(waiting(ds) if early else ds.prefetched_epoch)
            assert seen == ([1, 2, 6] if early else [None] * 3), early


def test_order_is_the_epoch_the_batches_then_emit_planned_without_reading(fixtures):
    out, _ = fixtures
    store = out / "paired.zarr"
    g = isb.open_geometries(store, ["raw"])
    with isb.InSituDataset(store, None, g, batch_size=7, block_chunks=4, seed=3) as ds:
        orders = []
        for epoch in (0, 1):
            ds.set_epoch(epoch)
            pool = ds.stats()["pool"]
            order = ds.order()
            assert ds.stats()["pool"] == pool, "planning an order reads nothing"
            assert order.sample_indices.dtype == order.block_ends.dtype == np.int64
            emitted = np.concatenate([b.sample_indices for b in ds.train])
            np.testing.assert_array_equal(order.sample_indices, emitted)
            ends = order.block_ends
            assert ends[-1] == len(emitted) and np.all(np.diff(ends) > 0) and ends[0] > 0
            assert len(ends) > 1, "several blocks of 4 chunks"
            assert [len(b) for b in order.blocks()] == np.diff(ends, prepend=0).tolist()
            orders.append(order.sample_indices)
        assert not np.array_equal(*orders), "each epoch its own order"
        ds.set_epoch(0)
        np.testing.assert_array_equal(ds.order("train").sample_indices, orders[0])
        seq = ds.order("all").sample_indices
        np.testing.assert_array_equal(seq, np.concatenate([b.sample_indices for b in ds.all]))
        assert seq.tolist() == sorted(seq.tolist()), "`all` is sequential"
        with pytest.raises(isb.InvalidArgument, match="holdout"):
            ds.order("holdout")
        with pytest.raises(isb.InvalidArgument, match="`val` is empty"):
            ds.order("val")
        with pytest.raises(TypeError, match="split must be a str"):
            ds.order(0)
    with pytest.raises(isb.Closed):
        ds.order()
    # The ramp shows in the blocks: 12 samples in chunks of 4, batches of 3, blocks of 3 chunks.
    era = era5(fixtures)
    for fast, ends in ((False, [12]), (True, [4, 12])):
        with isb.InSituDataset(era, None, isb.open_geometries(era, ["t2m"]), batch_size=3,
                               block_chunks=3, fast_first_batch=fast) as ds:
            order = ds.order()
            assert order.block_ends.tolist() == ends, fast
            assert sorted(order.sample_indices.tolist()) == list(range(12))
            np.testing.assert_array_equal(
                order.sample_indices, np.concatenate([b.sample_indices for b in ds.train]))


def test_a_resumed_epoch_yields_the_rest_of_a_whole_one_and_reads_only_its_chunks(fixtures):
    out, _ = fixtures
    store = out / "paired.zarr"
    g = isb.open_geometries(store, ["raw"])
    with isb.InSituDataset(store, None, g, batch_size=7, block_chunks=4, seed=3) as ds:
        ds.set_epoch(2)
        whole = [(b.sample_indices.tolist(), b.arrays["raw"].copy()) for b in ds.train]
        n = len(ds.train)
        assert len(whole) == n and len(whole[-1][0]) < 7, "a short last batch"
        assert len(iter(ds.train)) == n
        for k in (0, 1, n // 2, n - 1, n):
            it = ds.train.from_batch(k)
            assert len(it) == n - k, "len() of a resumed iterator is the batches it yields"
            rest, positions = [], []
            for b in it:
                rest.append((b.sample_indices.tolist(), b.arrays["raw"].copy()))
                positions.append((b.epoch, b.index))
            assert [i for i, _ in rest] == [i for i, _ in whole[k:]], k
            # Each batch knows where it sits in the whole epoch: (epoch, index + 1) resumes
            # right after it.
            assert positions == [(2, j) for j in range(k, n)], k
            assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(rest, whole[k:]))
            # One sample per chunk of `raw`: only the chunks of the batches yielded are drawn.
            s = ds.stats()
            assert s["cache_hits"] + s["cache_misses"] == sum(len(i) for i, _ in rest), k
            # The report says where the pass started and how many it yielded.
            assert (s["start_batch"], s["batches"], s["batches_total"]) == (k, n - k, n - k), s
        with pytest.raises(isb.InvalidArgument, match=f"`start_batch` = {n + 1}: an epoch of `train` has {n} batches"):
            ds.train.from_batch(n + 1)
        with pytest.raises(isb.InvalidArgument, match="`start_batch` = -1"):
            ds.train.from_batch(-1)
        with pytest.raises(TypeError, match="`start_batch` must be an int"):
            ds.train.from_batch(1.5)


def test_drop_last_yields_full_batches_the_whole_epochs_first_and_reads_only_their_chunks(fixtures):
    out, _ = fixtures
    store = out / "paired.zarr"
    g = isb.open_geometries(store, ["raw"])
    kw = dict(batch_size=7, block_chunks=4, seed=3)
    with isb.InSituDataset(store, None, g, **kw) as whole, \
            isb.InSituDataset(store, None, g, drop_last=True, **kw) as ds:
        n = whole.train.n_samples
        assert n % 7 and len(ds.train) == n // 7 == len(whole.train) - 1
        assert ds.train.n_samples == n // 7 * 7
        for epoch in (0, 1):
            whole.set_epoch(epoch)
            ds.set_epoch(epoch)
            full = [b.sample_indices.tolist() for b in whole.train]
            kept = [b.sample_indices.tolist() for b in ds.train]
            assert kept == full[:-1] and all(len(i) == 7 for i in kept)
            # One sample per chunk of `raw`: the left-out rows' chunks are not read.
            s = ds.stats()
            assert s["cache_hits"] + s["cache_misses"] == n // 7 * 7
    with pytest.raises(TypeError, match="`drop_last` must be a bool or a list of split names"):
        isb.InSituDataset(store, None, g, drop_last=1)
    with pytest.raises(TypeError, match="`drop_last` must be a bool or a list of split names"):
        isb.InSituDataset(store, None, g, drop_last=["train", 1])
    with isb.InSituDataset(store, None, g, batch_size=10**6, drop_last=True) as ds, \
            pytest.raises(isb.InvalidArgument, match="`drop_last`.*fewer than batch_size"):
        iter(ds.train)
    # For train only: full training batches, every validation sample.
    thirds = isb.split_by_chunk(g["raw"], (0.5, 0.5, 0.0))
    with isb.InSituDataset(store, thirds, g, drop_last=["train"], **kw) as ds, \
            isb.InSituDataset(store, thirds, g, **kw) as whole:
        assert [len(b) for b in ds.train] == [7] * (whole.train.n_samples // 7)
        val = [b.sample_indices.tolist() for b in ds.val]
        assert val == [b.sample_indices.tolist() for b in whole.val]
        assert sum(map(len, val)) == whole.val.n_samples and len(val[-1]) < 7
    with pytest.raises(isb.InvalidArgument, match="`drop_last`.*training"):
        isb.InSituDataset(store, thirds, g, drop_last=("training",))


HUGE_PAGE_PROBE = """
import ctypes, sys
ctypes.CDLL(None).prctl(41, 0, 0, 0, 0)  # PR_SET_THP_DISABLE off, whatever the parent set
def thp():
    return [l.split()[1] for l in open("/proc/self/status") if l.startswith("THP_enabled:")]
before = thp()
import insitubatch as isb
with isb.InSituDataset(sys.argv[1], batch_size=4) as ds:
    next(iter(ds.train))
    size, advised = 0, []
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            size = hi - lo
        elif line.startswith("VmFlags:") and size >= 64 << 20:
            advised.append("hg" in line.split())
    print(sum(advised), len(advised), before == thp())
"""


def test_the_library_advises_no_huge_pages_and_leaves_the_hosts_alone(fixtures):
    # The library stops mimalloc advising transparent huge pages for its arenas (a fresh
    # process's first epoch touches less slowly, docs/tuning.md) without disabling them for the
    # host process; MIMALLOC_ALLOW_THP=1 gives mimalloc its own default back.
    store = era5(fixtures)
    env = {k: v for k, v in os.environ.items() if k != "MIMALLOC_ALLOW_THP"}
    runs = {}
    for allow in (None, "1"):
        e = env if allow is None else {**env, "MIMALLOC_ALLOW_THP": allow}
        out = subprocess.run([sys.executable, "-c", HUGE_PAGE_PROBE, str(store)], env=e,
                             check=True, capture_output=True, text=True).stdout.split()
        runs[allow] = (int(out[0]), int(out[1]), out[2] == "True")
    advised, arenas, unchanged = runs[None]
    assert arenas >= 1, "mimalloc maps its arenas 1 GiB at a time"
    assert advised == 0, f"{advised} of {arenas} large mappings advised huge pages"
    assert unchanged, "loading the library changed the host process's THP_enabled"
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if mode.exists() and "[never]" not in mode.read_text():
        assert runs["1"][0] >= 1, "with MIMALLOC_ALLOW_THP=1 mimalloc advises its arenas"


def test_arrays_alias_rust_memory_and_outlive_everything_in_any_drop_order(fixtures):
    store = era5(fixtures)
    ref = zarr.open_array(store / "t2m", mode="r")[...]
    ds = isb.InSituDataset(store, batch_size=4, shuffle=False)
    it = iter(ds.all)
    b0 = next(it)
    keep_view = b0.arrays["t2m"][1:3]      # a numpy view keeps the buffer too
    keep_whole = next(it).arrays["u10"]
    addr = b0.arrays["t2m"].__array_interface__["data"][0]
    assert addr % 4096 == 0, "batch buffers are page aligned"
    assert not b0.arrays["t2m"].flags.owndata, "no copy: numpy does not own the memory"
    # Drop everything else in an unfriendly order: the iterator mid-epoch, the dataset, the batch.
    del it
    ds.close()
    ds.close()  # idempotent
    del b0
    gc.collect()
    np.testing.assert_array_equal(keep_view, ref[1:3])
    u10 = zarr.open_array(store / "u10", mode="r")[...]
    np.testing.assert_array_equal(keep_whole, u10[4:8])
    with pytest.raises(isb.Closed):
        next(iter(ds.train))


def test_batch_transforms_run_in_the_consumer(fixtures):
    store = era5(fixtures)

    def double(batch):
        batch.arrays = {k: v * 2 for k, v in batch.arrays.items()}
        return batch

    with isb.InSituDataset(store, batch_size=12, shuffle=False, batch_transforms=[double]) as ds:
        (b,) = list(ds.all)
        ref = zarr.open_array(store / "station", mode="r")[...]
        np.testing.assert_array_equal(b.arrays["station"], ref * 2)


def test_bad_arguments_are_named(fixtures):
    store = era5(fixtures)
    with pytest.raises(TypeError, match="batch_sise"):
        isb.InSituDataset(store, batch_sise=3)
    with pytest.raises(ValueError, match="batch_size"):
        isb.InSituDataset(store, batch_size=0)
    with pytest.raises(isb.InvalidArgument, match="max_inflight"):
        isb.InSituDataset(store, max_inflight=-1)
    # Out-of-range knobs are refused by name, never spawned or allocated until something breaks.
    with pytest.raises(isb.InvalidArgument, match="`max_inflight` = 1000000: at most 4096"):
        isb.InSituDataset(store, max_inflight=10**6)
    with pytest.raises(isb.InvalidArgument, match="`executor_threads` = 1000000"):
        isb.InSituDataset(store, executor_threads=10**6)
    with pytest.raises(isb.InvalidArgument, match="`batch_size` .* below 2\\*\\*64"):
        isb.InSituDataset(store, batch_size=2**70)
    with isb.InSituDataset(store) as ds:
        n_train = sum(len(b) for b in ds.train)
    with isb.InSituDataset(store, batch_size=2**63) as ds:  # over the split: one batch of it all
        assert [len(b) for b in ds.train] == [n_train]
    with pytest.raises(TypeError, match="prefetch_depth"):
        isb.InSituDataset(store, prefetch_depth="2")
    with pytest.raises(ValueError, match="on_bad_chunk"):
        isb.InSituDataset(store, on_bad_chunk="skip")
    with pytest.raises(FileNotFoundError, match="no-such.zarr"):
        isb.InSituDataset(store.parent / "no-such.zarr")
    with pytest.raises(TypeError, match="`store` must be a path"):
        isb.InSituDataset(5)
    with isb.InSituDataset(os.fsencode(store)) as ds:  # bytes paths are paths too
        assert ds.geometries
    assert list(isb.open_geometries(store, "t2m")) == ["t2m"], "one name, not its letters"
    with isb.InSituDataset(store) as ds:
        with pytest.raises(KeyError, match="no label"):
            next(iter(ds.train)).stack(["nope"])
    g = isb.open_geometries(store)
    with pytest.raises(ValueError, match="fractions"):
        isb.split_by_chunk(g["t2m"], (0.9, 0.3))
    with pytest.raises(ValueError, match="sample_range"):
        isb.split_by_chunk(g["t2m"], (1.0,), sample_range=(5, 99))
    with pytest.raises(isb.InvalidArgument, match="`fractions` .* finite"):
        isb.split_by_chunk(g["t2m"], (float("nan"),))
    with pytest.raises(isb.InvalidArgument, match="window offset of label 'y'"):
        isb.InSituDataset(store, geometries={"x": g["t2m"], "y": g["t2m"].shift(2**70)})
    with pytest.raises(isb.InvalidArgument, match="`geometries` is empty"):
        isb.InSituDataset(store, geometries={})
    good = isb.split_by_chunk(g["t2m"], (1.0,))
    assert isb.SplitManifest.from_json(good.to_json()).data == good.data
    for text, needle in [
        ("{]", "not JSON"),
        ('{"splits": 5}', "no `splits` object"),
        ('{"splits": {"train": [0, -1]}, "array": "t2m"}', "chunk indices"),
        ('{"splits": {"train": [0]}}', "no `array`"),
    ]:
        with pytest.raises(isb.InvalidArgument, match=needle):
            isb.SplitManifest.from_json(text)
    other = isb.split_by_chunk(isb.open_geometries(fixtures[0] / "paired.zarr")["raw"], (1.0,))
    with pytest.raises(ValueError, match="made for array `raw`"):
        isb.InSituDataset(store, other)
    with isb.InSituDataset(store) as ds:
        with pytest.raises(ValueError, match="split `val` is empty"):
            next(iter(ds.val))
    with pytest.raises(ValueError, match="needs a cache_dir"):
        isb.InSituDataset(store, persist=True)


def test_a_forked_child_gets_a_clear_error_and_the_parent_keeps_working(fixtures):
    store = era5(fixtures)
    ds = isb.InSituDataset(store, batch_size=4)
    assert len(list(ds.train)) == 3
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            next(iter(ds.train))
        except isb.WrongProcess as e:
            code = 0 if "fork" in str(e) else 2
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert len(list(ds.train)) == 3
    ds.close()


def test_stats_report_hits_misses_and_bad_chunks(fixtures):
    store = era5(fixtures)
    with isb.InSituDataset(store, batch_size=4, cache_budget_bytes=1 << 20) as ds:
        list(ds.train)
        assert ds.cache_misses == 9 and ds.cache_hits == 0  # 3 variables x 3 chunks
        ds.set_epoch(1)
        list(ds.train)
        assert ds.cache_hits == 9 and ds.cache_misses == 0
        assert ds.bad_chunks == []
        s = ds.stats()
        assert s["batches"] == 3 and s["pool"]["budget_bytes"] == 1 << 20


def test_a_corrupt_chunk_raises_naming_the_key_then_next_says_it_failed_or_nan_fills(fixtures, tmp_path):
    import shutil

    src = fixtures[0] / "v3_zstd.zarr"
    store = tmp_path / "corrupt.zarr"
    shutil.copytree(src, store)
    (store / "c" / "1" / "0" / "0").write_bytes(b"this is not zstd")
    with isb.InSituDataset(store, batch_size=2, shuffle=False) as ds:
        it = iter(ds.all)
        with pytest.raises(isb.BadData, match="c/1/0/0"):
            for _ in it:
                pass
        with pytest.raises(isb.Cancelled, match="failed earlier"):
            next(it)
    with isb.InSituDataset(store, batch_size=2, shuffle=False, on_bad_chunk="nan") as ds:
        ref = zarr.open_array(src, mode="r")[...]
        for b in ds.all:
            for r, idx in enumerate(b.sample_indices):
                row = b.arrays[""][r] if "" in b.arrays else next(iter(b.arrays.values()))[r]
                if 4 <= idx < 8:
                    assert np.isnan(row).all()
                else:
                    np.testing.assert_array_equal(row, ref[idx])
        assert ds.bad_chunks == [("", (1, 0, 0), "c/1/0/0")]


F_SETLEASE = 1024  # fcntl.F_SETLEASE on Linux (the module has it from Python 3.12 on)


@contextlib.contextmanager
def stalled_chunk(store, key):
    """A write lease on a chunk file: opening it waits until the lease is released, as a store
    that stops answering would (the kernel breaks a lease after lease-break-time, 45 s). Yields
    a function that releases it."""
    import fcntl
    import signal

    import time

    old_sigio = signal.signal(signal.SIGIO, signal.SIG_IGN)  # the holder's "someone waits" signal
    fd = os.open(store / key, os.O_RDONLY)
    try:
        # A write lease needs nobody else to hold the file open; an io_uring instance that just
        # read it may keep a reference for a moment after it is closed.
        for attempt in range(100):
            try:
                fcntl.fcntl(fd, F_SETLEASE, fcntl.F_WRLCK)
                break
            except BlockingIOError:
                if attempt == 99:
                    raise
                time.sleep(0.05)
        yield lambda: fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
    finally:
        os.close(fd)
        signal.signal(signal.SIGIO, old_sigio)


@pytest.fixture
def stalled_store(fixtures, tmp_path):
    """A copy of the v3_zstd store whose first chunk stalls (a sequential pass needs it first):
    yields the store and a function that lets the chunk be read."""
    import shutil

    store = tmp_path / "stalled.zarr"
    shutil.copytree(fixtures[0] / "v3_zstd.zarr", store)
    with stalled_chunk(store, "c/0/0/0") as release:
        yield store, release


@pytest.fixture
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt in this test even where the launcher started the process
    with SIGINT ignored (a shell starts background jobs so, and Python then keeps it ignored)."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_interrupts_a_wait_for_a_batch_and_the_iteration_goes_on(
    fixtures, stalled_store, sigint_raises
):
    import signal
    import threading
    import time

    store, release = stalled_store
    ref = zarr.open_array(fixtures[0] / "v3_zstd.zarr", mode="r")[...]
    with isb.InSituDataset(store, batch_size=2, shuffle=False) as ds:
        it = iter(ds.all)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            next(it)
        # Interrupted while the store stalled, not when the kernel broke the lease.
        assert time.monotonic() - t0 < 30
        release()
        rows = []
        for b in it:
            for r, idx in enumerate(b.sample_indices):
                np.testing.assert_array_equal(b.arrays[""][r], ref[idx])
            rows.extend(b.sample_indices.tolist())
        assert rows == list(range(ref.shape[0])), "every sample once, in order"


def test_one_epoch_from_two_threads_is_an_error_and_close_ends_a_waiting_next(stalled_store):
    import threading

    store, release = stalled_store
    with isb.InSituDataset(store, batch_size=2, shuffle=False) as ds:
        it = iter(ds.all)
        raised = []
        waiting = threading.Thread(target=lambda: raised.append(_raised_by(next, it)))
        waiting.start()
        while it._owner is None:  # until the other thread is inside next()
            waiting.join(0.01)
        with pytest.raises(isb.InvalidArgument, match="another thread"):
            next(it)
        # Closing from here ends the waiting next() and does not wait for the stalled read.
        it.close()
        waiting.join(30)
        assert not waiting.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], isb.Closed), raised
        with pytest.raises(StopIteration):
            next(it)
        # Before the dataset closes: the thread fallback's shutdown waits for a stuck read.
        release()


def test_the_library_refuses_a_second_thread_inside_an_iteration(stalled_store):
    import ctypes
    import threading

    from insitubatch._lib import lib

    store, release = stalled_store

    def call(it, timeout_ms):
        b, err = ctypes.c_void_p(), ctypes.c_void_p()
        status = lib.isb_iter_next_timeout(it, timeout_ms, ctypes.byref(b), ctypes.byref(err))
        message = lib.isb_error_message(err) if err.value else b""
        lib.isb_error_free(err)
        if b.value:
            lib.isb_batch_free(b)
        return status, message

    with isb.InSituDataset(store, batch_size=2, shuffle=False) as ds:
        epoch = iter(ds.all)  # kept alive: it owns the handle
        it = epoch._it  # the raw handle, called without the shim's own lock
        waited = []

        def long_wait():  # one call that holds the iteration until the chunk can be read
            while True:
                status, _ = call(it, 60_000)
                if status != 2:  # 2: the probe below held it at that instant; go again
                    waited.append(status)
                    return

        waiter = threading.Thread(target=long_wait)
        waiter.start()
        refused = []
        for _ in range(500):  # until the probe meets the waiter inside its call
            status, message = call(it, 0)
            assert status in (2, 16), status  # refused, or timed out with no batch taken
            if status == 2:
                refused.append(message)
                break
            waiter.join(0.01)
        assert refused and b"in use by another thread" in refused[0]
        release()
        waiter.join(60)
        assert waited == [0], "the waiter got the first batch once the chunk was readable"


def _raised_by(f, *args):
    try:
        f(*args)
    except BaseException as e:  # noqa: BLE001 - the test inspects it
        return e
    return None


def test_a_batch_an_interrupted_wait_received_is_the_next_one_delivered(fixtures):
    import ctypes

    from insitubatch._lib import lib

    src = fixtures[0] / "v3_zstd.zarr"
    n = zarr.open_array(src, mode="r").shape[0]
    with isb.InSituDataset(src, batch_size=2, shuffle=False) as ds:
        it = iter(ds.all)
        # What Ctrl-C right after the library returned a batch leaves in the iterator.
        status = lib.isb_iter_next_timeout(it._it, 60_000, ctypes.byref(it._b), ctypes.byref(it._err))
        assert status == 0 and it._b.value
        rows = [b.sample_indices.tolist() for b in it]
        assert rows[0] == [0, 1]
        assert sum(rows, []) == list(range(n)), "nothing lost, nothing twice"


def test_a_signal_handler_may_close_the_epoch_this_thread_is_waiting_on(stalled_store):
    import signal
    import threading

    store, release = stalled_store
    with isb.InSituDataset(store, batch_size=2, shuffle=False) as ds:
        it = iter(ds.all)
        # A graceful-shutdown handler (SLURM preemption, say) that stops the data first.
        old = signal.signal(signal.SIGUSR1, lambda *_: it.close())
        try:
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
            with pytest.raises(isb.Closed, match="closed while it waited"):
                next(it)
        finally:
            signal.signal(signal.SIGUSR1, old)
        with pytest.raises(StopIteration):
            next(it)
        release()


def _runtime_threads() -> int:
    """This process's threads named like the library's executors."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += "-exec-" in f.read()
        except (FileNotFoundError, ProcessLookupError):
            pass  # exited meanwhile: gone from the directory, or between open and read (ESRCH)
    return n


def test_ctrl_c_interrupts_opening_a_store_that_does_not_answer(fixtures, tmp_path, sigint_raises):
    import shutil
    import signal
    import threading
    import time

    store = tmp_path / "stalled.zarr"
    shutil.copytree(fixtures[0] / "v3_zstd.zarr", store)
    n = zarr.open_array(store, mode="r").shape[0]
    # zarrs starts rayon's pool from one of our executors on its first decode, and its threads
    # keep that name for the life of the process: count after it exists.
    with isb.InSituDataset(store, batch_size=4) as ds:
        assert sum(len(b) for b in ds.train) == n
    before = _runtime_threads()
    for open_it in (lambda: isb.InSituDataset(store), lambda: isb.open_geometries(store)):
        with stalled_chunk(store, "zarr.json") as release:
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
            t0 = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                open_it()
            # Interrupted while the metadata read stalled, not when the kernel broke the lease.
            assert time.monotonic() - t0 < 30
            release()
        # The abandoned open finishes on its own and what it opened is freed.
        for t in threading.enumerate():
            if t.name == "insitubatch-open":
                t.join(30)
                assert not t.is_alive()
    for _ in range(300):
        if _runtime_threads() == before:
            break
        time.sleep(0.01)
    assert _runtime_threads() == before, "the abandoned dataset's runtime was shut down"
    with isb.InSituDataset(store, batch_size=4) as ds:  # and the store opens normally after
        assert sum(len(b) for b in ds.train) == n


def test_next_while_another_thread_closes_the_epoch_waits_and_ends_it(fixtures):
    import threading

    with isb.InSituDataset(fixtures[0] / "v3_zstd.zarr", batch_size=2) as ds:
        it = iter(ds.all)
        next(it)
        got = []
        # What close() from another thread looks like while it frees the epoch: it has said so
        # and holds the lock. A next() then is not "another thread advancing the epoch".
        it._closing = True
        with it._lock:
            consumer = threading.Thread(target=lambda: got.append(_raised_by(next, it)))
            consumer.start()
            consumer.join(0.3)
            assert consumer.is_alive(), "next() waits for the close to finish"
            it._close()
        consumer.join(10)
        assert len(got) == 1 and isinstance(got[0], StopIteration), got


def test_one_sample_chunks_decoded_into_batch_rows_equal_the_pool_path(fixtures, monkeypatch):
    out, _ = fixtures
    store = out / "paired.zarr"  # raw: 61 samples, one per chunk
    ref = zarr.open_array(store / "raw", mode="r")[...]
    g = isb.open_geometries(store)

    def epoch():
        with isb.InSituDataset(store, None, {"r": g["raw"]}, batch_size=4) as ds:
            need = ds.memory_need("train")
            got = [(b.sample_indices.copy(), b.arrays["r"].copy()) for b in ds.train]
            return got, ds.stats(), need

    monkeypatch.setenv("INSITUBATCH_DECODE_INTO_BATCHES", "always")
    rows, s, need = epoch()
    # Each chunk decoded straight into its row, every sample zarr-python's, each once.
    assert s["tiles_into_batches"] == s["tiles_read"] == 61
    # No chunk is pinned in the pool; the batches the rows fill ahead of the gather are counted.
    assert (need["working_set_bytes"], need["pool_bytes"]) == (0, 0)
    assert 0 < need["rows_batches"] < need["batches"]
    assert sorted(i for idx, _ in rows for i in idx.tolist()) == list(range(61))
    for idx, arr in rows:
        np.testing.assert_array_equal(arr, ref[idx])
    monkeypatch.setenv("INSITUBATCH_DECODE_INTO_BATCHES", "never")
    pooled, p, pooled_need = epoch()
    assert (p["tiles_into_batches"], p["tiles_read"]) == (0, 61)
    assert pooled_need["rows_batches"] == 0 and pooled_need["working_set_bytes"] > 0
    assert len(pooled) == len(rows)
    for (ia, a), (ib, b) in zip(rows, pooled):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(a, b)
    monkeypatch.setenv("INSITUBATCH_DECODE_INTO_BATCHES", "sometimes")
    with pytest.raises(isb.InvalidArgument, match="INSITUBATCH_DECODE_INTO_BATCHES.*auto, always or never"):
        isb.InSituDataset(store, None, {"r": g["raw"]})


def test_coordinate_values_give_each_rows_time_and_decode_cf_times(fixtures, tmp_path):
    out, _ = fixtures
    for name in ("era5_v3.zarr", "era5_v2.zarr"):  # consolidated v3, listed v2
        store = out / name
        want_time = zarr.open_array(store / "time", mode="r")[...]
        got = isb.coordinate_values(store, "t2m")  # the sample axis: time, in chunks of 5
        assert got.dtype == np.int64 and np.array_equal(got, want_time), name
        lat = isb.coordinate_values(store, "u10", "latitude")
        assert lat.dtype == np.float32
        np.testing.assert_array_equal(lat, zarr.open_array(store / "latitude", mode="r")[...])
        g = isb.open_geometries(store)
        with isb.InSituDataset(store, None, {"x": g["t2m"], "y": g["t2m"].shift(2)},
                               batch_size=4) as ds:
            times = ds.coordinates("y")
            b = next(iter(ds.train))
            assert np.array_equal(times[b.read_indices("y")], want_time[b.sample_indices + 2])
            with pytest.raises(KeyError, match="no label 'z'"):
                ds.coordinates("z")
        with pytest.raises(isb.InvalidArgument, match="`level` is not a dimension"):
            isb.coordinate_values(store, "t2m", "level")
    with pytest.raises(isb.InvalidArgument, match="no dimension names"):
        isb.coordinate_values(out / "v3_zstd.zarr", "")

    # CF time units, as xarray writes them, decoded as xarray decodes them.
    path = tmp_path / "cf.zarr"
    root = zarr.open_group(path, mode="w", zarr_format=3)
    n = 7
    cases = {
        "h": ("int64", {"units": "hours since 1979-01-01 00:00:00", "calendar": "proleptic_gregorian"},
              np.arange(n) * 6,
              np.datetime64("1979-01-01T00") + np.arange(n) * np.timedelta64(6, "h")),
        "d": ("float64", {"units": "days since 2000-01-01T00:00:00Z"},
              np.array([0, 0.25, 1.5, np.nan, 366, 1e-6, -1]),
              np.array(["2000-01-01T00:00", "2000-01-01T06:00", "2000-01-02T12:00", "NaT",
                        "2001-01-01T00:00", "2000-01-01T00:00:00.086400", "1999-12-31T00:00"],
                       dtype="datetime64[ns]")),
        "s": ("int32", {"units": "seconds since 1970-01-01", "calendar": "standard"},
              np.arange(n) * 3600,
              np.datetime64("1970-01-01T00:00:00") + np.arange(n) * np.timedelta64(1, "h")),
    }
    for name, (dtype, attrs, stored, _) in cases.items():
        c = root.create_array(f"t{name}", shape=(n,), chunks=(3,), dtype=dtype, dimension_names=[f"t{name}"])
        c[...] = stored
        c.attrs.update(attrs)
        root.create_array(f"v{name}", shape=(n, 2), chunks=(2, 2), dtype="float32",
                          dimension_names=[f"t{name}", "x"])[...] = 0
    for name, (_, _, stored, want) in cases.items():
        got = isb.coordinate_values(path, f"v{name}")
        assert got.dtype.kind == "M", name
        np.testing.assert_array_equal(got.astype("datetime64[ns]"), want.astype("datetime64[ns]"))
        raw = isb.coordinate_values(path, f"v{name}", decode_times=False)
        np.testing.assert_array_equal(raw, stored)
    xr = pytest.importorskip("xarray")
    decoded = xr.open_zarr(path, consolidated=False)
    for name, _ in cases.items():
        np.testing.assert_array_equal(isb.coordinate_values(path, f"v{name}").astype("datetime64[ns]"),
                                      decoded[f"t{name}"].values.astype("datetime64[ns]"))
    # A reference date beyond nanoseconds' reach (year 1): integers exactly, fractions to the
    # microsecond.
    for name, dtype, stored in (("y1i", "int64", [0, 365, 738_000]),
                                ("y1f", "float64", [0.5, 738_000.25, np.nan])):
        c = root.create_array(name, shape=(3,), chunks=(3,), dtype=dtype, dimension_names=[name])
        c[...] = stored
        c.attrs.update({"units": "days since 0001-01-01 00:00:00"})
        root.create_array(f"v{name}", shape=(3,), chunks=(3,), dtype="float32",
                          dimension_names=[name])[...] = 0
    np.testing.assert_array_equal(
        isb.coordinate_values(path, "vy1i"),
        np.datetime64("0001-01-01") + np.array([0, 365, 738_000]).astype("timedelta64[D]"))
    far = isb.coordinate_values(path, "vy1f")
    assert far.dtype == np.dtype("datetime64[us]")
    np.testing.assert_array_equal(far, np.array(["0001-01-01T12:00", "2021-07-30T06:00", "NaT"],
                                                dtype="datetime64[us]"))
    # A calendar numpy does not have is refused, saying how to get the numbers.
    c = root.create_array("tn", shape=(n,), chunks=(n,), dtype="int64", dimension_names=["tn"])
    c[...] = np.arange(n)
    c.attrs.update({"units": "days since 2000-01-01", "calendar": "noleap"})
    root.create_array("vn", shape=(n,), chunks=(n,), dtype="float32", dimension_names=["tn"])[...] = 0
    with pytest.raises(isb.Unsupported, match="decode_times=False"):
        isb.coordinate_values(path, "vn")
    np.testing.assert_array_equal(isb.coordinate_values(path, "vn", decode_times=False), np.arange(n))
    # Times past what numpy holds would wrap into wrong dates (numpy adds without checking):
    # refused naming the value, for integer and float steps alike.
    for name, dtype, stored in (("hi", "int64", [0, 2**62]), ("hf", "float64", [0.0, 1e300])):
        c = root.create_array(name, shape=(2,), chunks=(2,), dtype=dtype, dimension_names=[name])
        c[...] = stored
        c.attrs.update({"units": "hours since 2000-01-01"})
        root.create_array(f"v{name}", shape=(2,), chunks=(2,), dtype="float32",
                          dimension_names=[name])[...] = 0
        with pytest.raises(isb.BadData, match=re.escape(f"holds {stored[1]:g} hours since 2000")):
            isb.coordinate_values(path, f"v{name}")
        np.testing.assert_array_equal(isb.coordinate_values(path, f"v{name}", decode_times=False),
                                      np.asarray(stored, dtype=dtype))
    # Unsigned times past int64, and nanoseconds from a date past 2262 (numpy's nanosecond
    # dates end there; such times are read to the microsecond), the probe's two finds.
    for name, dtype, stored, units in (("hu", "uint64", [0, 2**63 + 5], "nanoseconds since 2000-01-01"),
                                       ("hn", "int64", [0, 5_000], "nanoseconds since 3000-01-01")):
        c = root.create_array(name, shape=(2,), chunks=(2,), dtype=dtype, dimension_names=[name])
        c[...] = stored
        c.attrs.update({"units": units})
        root.create_array(f"v{name}", shape=(2,), chunks=(2,), dtype="float32",
                          dimension_names=[name])[...] = 0
    with pytest.raises(isb.BadData, match=str(2**63 + 5)):
        isb.coordinate_values(path, "vhu")
    np.testing.assert_array_equal(
        isb.coordinate_values(path, "vhn"),
        np.array(["3000-01-01T00:00:00.000000", "3000-01-01T00:00:00.000005"], dtype="datetime64[us]"))
    # `insitubatch make-dataset` writes ERA5's CF attributes: 6-hourly times from 1979 (v3
    # and v2), which xarray decodes to the same dates.
    exe = Path(__file__).resolve().parents[3] / "target" / "release" / "insitubatch"
    for fmt in ("3", "2"):
        synth = tmp_path / f"synth_v{fmt}.zarr"
        subprocess.run([str(exe), "make-dataset", str(synth), "--samples", "9", "--grid", "3x4",
                        "--format", fmt], check=True, capture_output=True)
        got = isb.coordinate_values(synth, "t2m")
        want = np.datetime64("1979-01-01T00") + np.arange(9) * np.timedelta64(6, "h")
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got.astype("datetime64[ns]"),
                                      xr.open_zarr(synth).time.values.astype("datetime64[ns]"))


def test_the_time_example_in_the_python_docs_gives_each_rows_hour(tmp_path, python_docs_example):
    """docs/python-api.md, "Each sample's time": its example as printed, over a store whose
    time coordinate is in CF hours, against numpy's own arithmetic."""
    code = python_docs_example("## Each sample's time")
    path = tmp_path / "hourly.zarr"
    root = zarr.open_group(path, mode="w", zarr_format=3)
    t = root.create_array("time", shape=(30,), chunks=(7,), dtype="int64", dimension_names=["time"])
    t[...] = np.arange(30) * 3  # every 3 hours from 2020-02-28 22:00, across a leap day
    t.attrs.update({"units": "hours since 2020-02-28 22:00:00", "calendar": "standard"})
    root.create_array("t2m", shape=(30, 2, 3), chunks=(4, 2, 3), dtype="float32",
                      dimension_names=["time", "lat", "lon"])[...] = 0
    g = isb.open_geometries(path)
    with isb.InSituDataset(path, None, {"x": g["t2m"], "y": g["t2m"].shift(2)}, batch_size=8) as ds:
        scope = {"ds": ds}
        exec(code, scope)  # the loop runs to the last batch, which it leaves in scope
        b = scope["b"]
        want = np.datetime64("2020-02-28T22") + (b.sample_indices + 2) * np.timedelta64(3, "h")
        np.testing.assert_array_equal(scope["valid"], want)
        np.testing.assert_array_equal(scope["hour"], (22 + (b.sample_indices + 2) * 3) % 24)


def test_cf_times_decode_as_xarray_decodes_them_over_random_units_and_dates(tmp_path):
    """Random CF time coordinates (every unit, reference dates written padded or not, with or
    without a clock, `T` or a space, `Z`; integer and fractional values, negative ones too)
    against xarray's own decode."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(7)
    units = ["days", "hours", "minutes", "seconds", "milliseconds", "microseconds"]
    per_day = {"days": 1, "hours": 24, "minutes": 1440, "seconds": 86400,
               "milliseconds": 86_400_000, "microseconds": 86_400_000_000}
    path = tmp_path / "random_cf.zarr"
    root = zarr.open_group(path, mode="w", zarr_format=3)
    cases = []
    for k in range(40):
        unit = units[rng.integers(len(units))]
        y, mo, d = int(rng.integers(1800, 2100)), int(rng.integers(1, 13)), int(rng.integers(1, 29))
        date = f"{y}-{mo}-{d}" if rng.random() < 0.3 else f"{y:04d}-{mo:02d}-{d:02d}"
        if rng.random() < 0.6:
            sep = "T" if rng.random() < 0.5 else " "
            date += f"{sep}{rng.integers(0, 24):02d}:{rng.integers(0, 60):02d}:{rng.integers(0, 60):02d}"
            date += "Z" if rng.random() < 0.3 else ""
        span = int(per_day[unit] * 365 * 50)  # up to fifty years either way
        if rng.random() < 0.5:
            dtype, stored = "int64", rng.integers(-span, span, 6)
        else:  # quarter steps: exact in binary, so no rounding to compare
            dtype, stored = "float64", rng.integers(-span, span, 6) / 4
        c = root.create_array(f"t{k}", shape=(6,), chunks=(4,), dtype=dtype, dimension_names=[f"t{k}"])
        c[...] = stored
        c.attrs.update({"units": f"{unit} since {date}", "calendar": "standard"})
        root.create_array(f"v{k}", shape=(6,), chunks=(6,), dtype="float32",
                          dimension_names=[f"t{k}"])[...] = 0
        cases.append(f"{unit} since {date} ({dtype})")
    decoded = xr.open_zarr(path, consolidated=False)
    for k, what in enumerate(cases):
        got = isb.coordinate_values(path, f"v{k}")
        want = decoded[f"t{k}"].values
        np.testing.assert_array_equal(got.astype("datetime64[ns]"), want.astype("datetime64[ns]"),
                                      err_msg=what)
