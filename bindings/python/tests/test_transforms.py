"""Chunk transforms through Python: every sample equals numpy's transform of zarr-python's value,
bit for bit; scopes by array path; NaN repair after a bad chunk; a persisted cache holds the
transformed chunk, numpy-readable, and goes stale per array; bad transforms are clear errors."""

import json

import numpy as np
import pytest
import zarr

import insitubatch as isb
from insitubatch.transforms import (
    Affine, Cast, Clip, Coarsen, FillNaN, Regrid, Standardize, applies,
)


def store_of(fixtures, name):
    out, _ = fixtures
    return out / name


def check(ds, label, want, view="train"):
    """Every row of an epoch equals `want` at its read index; returns the rows seen."""
    seen = 0
    for b in getattr(ds, view):
        for r, idx in enumerate(b.read_indices(label)):
            got = b.arrays[label][r]
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want[idx], err_msg=f"{label} sample {idx}")
            seen += 1
    return seen


def test_samples_equal_numpys_transform_bit_for_bit(fixtures):
    store = store_of(fixtures, "era5_v3.zarr")
    t2m = zarr.open_array(store / "t2m", mode="r")[...]
    u10 = zarr.open_array(store / "u10", mode="r")[...]
    mean, std = np.float32(280.5), np.float32(11.25)
    g = isb.open_geometries(store, ["t2m", "u10"])
    with isb.InSituDataset(
        store, None, {"x": g["t2m"], "y": g["t2m"].shift(1), "u": g["u10"]}, batch_size=5,
        chunk_transforms=[
            applies("t2m", Affine(offset=-273.15)),
            applies(["u10"], Standardize(mean=float(mean), std=float(std))),
            Clip(-50.0, 50.0),
        ],
    ) as ds:
        t_want = np.clip(t2m * np.float32(1.0) + np.float32(-273.15), np.float32(-50), np.float32(50))
        u_want = np.clip((u10 - mean) / std, np.float32(-50), np.float32(50))
        assert (t2m - 273.15 > 50).any(), "the clip must bite for this test to mean something"
        assert check(ds, "x", t_want) == 11
        assert check(ds, "y", t_want) == 11
        assert check(ds, "u", u_want) == 11


def test_per_level_statistics_on_an_inner_chunked_field(fixtures):
    # (6, 7, 9) float32 in (2, 3, 4) chunks: each slot assembles six tiles, then standardises
    # level i (the first inner axis) with mean[i], std[i].
    store = store_of(fixtures, "v3_inner.zarr")
    ref = zarr.open_array(store, mode="r")[...]
    mean = ref.mean(axis=(0, 2)).astype(np.float64)
    std = ref.std(axis=(0, 2)).astype(np.float64)
    with isb.InSituDataset(store, batch_size=4,
                           chunk_transforms=[Standardize(mean=mean, std=std, axis=0)]) as ds:
        want = (ref - mean.astype(np.float32)[None, :, None]) / std.astype(np.float32)[None, :, None]
        label = next(iter(ds.geometries))
        assert check(ds, label, want) == 6


def test_fill_nan_repairs_a_bad_chunk(fixtures, tmp_path):
    import shutil

    src = store_of(fixtures, "v3_zstd.zarr")
    store = tmp_path / "bad.zarr"
    shutil.copytree(src, store)
    (store / "c" / "1" / "0" / "0").write_bytes(b"this is not zstd")
    ref = zarr.open_array(src, mode="r")[...]  # float64 (11, 4, 5) in chunks of 4
    want = ref.copy()
    want[4:8] = -1.0
    with isb.InSituDataset(store, batch_size=3, on_bad_chunk="nan",
                           chunk_transforms=[{"type": "fill_nan", "value": -1.0}]) as ds:
        label = next(iter(ds.geometries))
        assert check(ds, label, want, view="all") == 11
        assert [key for _, _, key in ds.bad_chunks] == ["c/1/0/0"]


def test_a_persisted_cache_holds_the_transformed_chunk_and_goes_stale_per_array(fixtures, tmp_path):
    store = store_of(fixtures, "era5_v3.zarr")
    cache = tmp_path / "cache"
    t2m = zarr.open_array(store / "t2m", mode="r")[...]
    g = isb.open_geometries(store, ["t2m", "u10"])

    def open_(offset, **kw):
        return isb.InSituDataset(store, None, g, batch_size=4, cache_dir=cache, persist=True,
                                 chunk_transforms=[applies("t2m", Affine(offset=offset))], **kw)

    with open_(-273.15) as ds:
        check(ds, "t2m", t2m + np.float32(-273.15))
    # The slot files hold the transformed chunks.
    entries = [json.loads(l) for l in (cache / "insitu_cache.jsonl").read_text().splitlines()[1:]]
    for e in entries:
        if e["array"] == "t2m":
            c = e["chunk"]
            np.testing.assert_array_equal(np.load(cache / e["file"]),
                                          t2m[c * 4:(c + 1) * 4] + np.float32(-273.15))
    with open_(-273.15) as ds:
        check(ds, "t2m", t2m + np.float32(-273.15))
        assert (ds.stats()["bytes_decoded"], ds.cache_revived) == (0, 6)
    with pytest.raises(isb.StaleCache, match=r"\[t2m\]"):
        open_(-273.0)
    with open_(-273.0, reset_stale_cache=True) as ds:
        check(ds, "t2m", t2m + np.float32(-273.0))
        assert (ds.cache_revived, ds.cache_misses) == (3, 3)  # u10 revived, t2m rebuilt


def test_bad_transforms_are_clear_errors(fixtures):
    store = store_of(fixtures, "era5_v3.zarr")
    with pytest.raises(TypeError, match="Python callable"):
        isb.InSituDataset(store, chunk_transforms=[lambda c: c])
    with pytest.raises(isb.InvalidArgument, match="names `t2`.*not labels"):
        isb.InSituDataset(store, chunk_transforms=[applies("t2", FillNaN(0.0))])
    with pytest.raises(isb.InvalidArgument, match="unknown transform type `log`"):
        isb.InSituDataset(store, chunk_transforms=[{"type": "log"}])
    with pytest.raises(isb.InvalidArgument, match="swap them"):
        isb.InSituDataset(store, chunk_transforms=[Clip(1.0, 0.0)])
    with pytest.raises(isb.InvalidArgument, match="inner axis 0 has 9"):
        isb.InSituDataset(store, None, isb.open_geometries(store, ["t2m"]),
                          chunk_transforms=[Standardize(mean=[0.0, 1.0], std=[1.0, 1.0], axis=0)])
    with pytest.raises(ValueError, match="finite"):
        isb.InSituDataset(store, chunk_transforms=[Affine(scale=float("nan"))])
    with pytest.raises(TypeError, match="list of transforms"):
        isb.InSituDataset(store, chunk_transforms=Affine())


def test_cast_and_coarsen_change_what_a_sample_is(fixtures, tmp_path):
    # int16 (9, 5, 7): cast to float32 (numpy's astype), then 2 x 3 block means of (5, 7),
    # trimming the last row and column: samples are (2, 2) float32 in batches and cache files.
    store = store_of(fixtures, "v2_zstd_slash.zarr")
    ref = zarr.open_array(store, mode="r")[...]
    want = ref.astype(np.float32)[:, :4, :6].reshape(9, 2, 2, 2, 3).mean(axis=(2, 4))
    cache = tmp_path / "cache"
    with isb.InSituDataset(store, batch_size=4, cache_dir=cache, persist=True,
                           chunk_transforms=[Cast("float32"), Coarsen([2, 3])]) as ds:
        label = next(iter(ds.geometries))
        assert ds.sample_formats[label] == ((2, 2), np.dtype("float32"))
        assert ds.geometries[label].dtype == "int16"  # the geometry stays the stored array's
        seen = 0
        for b in ds.train:
            a = b.arrays[label]
            assert a.shape == (len(b), 2, 2) and a.dtype == np.float32
            for r, idx in enumerate(b.read_indices(label)):
                np.testing.assert_allclose(a[r], want[idx], rtol=1e-6)
                seen += 1
        assert seen == 9
    entries = [json.loads(l) for l in (cache / "insitu_cache.jsonl").read_text().splitlines()[1:]]
    for e in entries:
        slot = np.load(cache / e["file"])
        assert slot.shape == (4, 2, 2) and slot.dtype == np.float32
        c = e["chunk"]
        rows = want[c * 4:(c + 1) * 4]
        np.testing.assert_allclose(slot[:len(rows)], rows, rtol=1e-6)
    # A float-only transform on the int16 array says to cast first.
    with pytest.raises(isb.InvalidArgument, match="int16.*cast"):
        isb.InSituDataset(store, chunk_transforms=[Affine(scale=2.0)])
    with pytest.raises(ValueError, match="positive"):
        isb.InSituDataset(store, chunk_transforms=[Coarsen([0, 1])])


def test_regrid_equals_numpy_interp_along_each_axis(fixtures):
    # t2m (12, 9, 16): latitudes 90..-90 (falling), longitudes 0..337.5. Targets include an
    # exact hit, points between, and points past both ends (edge values, as numpy.interp).
    store = store_of(fixtures, "era5_v3.zarr")
    ref = zarr.open_array(store / "t2m", mode="r")[...]
    lat = zarr.open_array(store / "latitude", mode="r")[...].astype(np.float64)
    lon = zarr.open_array(store / "longitude", mode="r")[...].astype(np.float64)
    new_lat = np.array([95.0, 67.5, 10.0, -3.3, -90.0])
    new_lon = np.array([-5.0, 0.0, 100.0, 200.25, 337.5, 350.0])

    def interp(a, axis, xp, x):
        order = np.argsort(xp)  # numpy.interp wants rising coordinates
        return np.apply_along_axis(lambda r: np.interp(x, xp[order], r[order]), axis, a)

    want = interp(interp(ref.astype(np.float64), 1, lat, new_lat), 2, lon, new_lon)
    want = want.astype(np.float32)
    with isb.InSituDataset(store, None, isb.open_geometries(store, ["t2m"]), batch_size=5,
                           chunk_transforms=[Regrid(axes=(0, 1), src=(lat, lon),
                                                    dst=(new_lat, new_lon))]) as ds:
        assert ds.sample_formats["t2m"] == ((5, 6), np.dtype("float32"))
        assert check(ds, "t2m", want) == 12
    with pytest.raises(isb.InvalidArgument, match="9 indices"):
        isb.InSituDataset(store, chunk_transforms=[applies("t2m", Regrid(
            axes=(0, 1), src=(lat[:5], lon), dst=(new_lat, new_lon)))])


def test_regrid_nearest_copies_a_mask_exactly(fixtures):
    # mask: uint8 (61, 5, 6) in chunks of 30. Targets between, on ties, and past both ends.
    store = store_of(fixtures, "paired.zarr")
    ref = zarr.open_array(store / "mask", mode="r")[...]
    src = (np.array([80.0, 60.0, 40.0, 20.0, 0.0]), np.arange(6) * 2.0)  # falling, rising
    dst = (np.array([90.0, 70.0, 51.0, 3.0, -9.0]), np.array([-1.0, 1.0, 2.9, 3.0, 11.0]))

    def nearest(xp, x):
        # argmin of the distance, a tie to the smaller coordinate.
        d = np.abs(xp[None, :] - x[:, None])
        best = d == d.min(axis=1, keepdims=True)
        return np.array([np.flatnonzero(row)[np.argmin(xp[row])] for row in best])

    want = ref[:, nearest(src[0], dst[0])][:, :, nearest(src[1], dst[1])]
    with isb.InSituDataset(store, None, isb.open_geometries(store, ["mask"]), batch_size=7,
                           chunk_transforms=[Regrid((0, 1), src, dst, method="nearest")]) as ds:
        assert ds.sample_formats["mask"] == ((5, 5), np.dtype("uint8"))
        got = {}
        for b in ds.train:
            for i, s in zip(b.sample_indices.tolist(), b.arrays["mask"]):
                got[i] = s.copy()
        assert sorted(got) == list(range(61))
        assert all(np.array_equal(got[i], want[i]) for i in got)
    # Linear needs floats, and says nearest would do.
    with pytest.raises(isb.InvalidArgument, match="uint8.*nearest"):
        isb.InSituDataset(store, None, isb.open_geometries(store, ["mask"]),
                          chunk_transforms=[Regrid((0, 1), src, dst)])
    with pytest.raises(ValueError, match="'linear', 'nearest' or 'conservative'"):
        isb.InSituDataset(store, chunk_transforms=[Regrid((0, 1), src, dst, method="cubic")])


def _cell_edges(c):
    """(lower, upper) edge of each cell around centres `c` (either direction): midpoints, and
    half a step past the ends."""
    order = np.argsort(c)
    x = c[order]
    e = np.concatenate([[x[0] - (x[1] - x[0]) / 2], (x[1:] + x[:-1]) / 2,
                        [x[-1] + (x[-1] - x[-2]) / 2]])
    lo, hi = np.empty_like(c), np.empty_like(c)
    lo[order], hi[order] = e[:-1], e[1:]
    return lo, hi


def test_conservative_regrid_on_the_sphere_is_the_area_weighted_mean_and_keeps_the_integral(fixtures):
    # t2m (12, 9, 16) on 22.5° cells (latitudes falling 90..-90) onto 45° cells whose first
    # longitude cell straddles 0°.
    store = store_of(fixtures, "era5_v3.zarr")
    ref = zarr.open_array(store / "t2m", mode="r")[...].astype(np.float64)
    lat = zarr.open_array(store / "latitude", mode="r")[...].astype(np.float64)
    lon = zarr.open_array(store / "longitude", mode="r")[...].astype(np.float64)
    new_lat, new_lon = np.array([-67.5, -22.5, 22.5, 67.5]), np.arange(8) * 45.0

    def lat_weights(src, dst):  # overlap of sin(latitude), edges clamped at the poles
        a, b = (np.clip(e, -90, 90) for e in _cell_edges(dst))
        c, d = (np.clip(e, -90, 90) for e in _cell_edges(src))
        lo, hi = np.maximum(a[:, None], c[None, :]), np.minimum(b[:, None], d[None, :])
        return np.where(hi > lo, np.sin(np.radians(hi)) - np.sin(np.radians(lo)), 0.0)

    def lon_weights(src, dst):  # overlap in degrees, across the seam too
        (a, b), (c, d) = _cell_edges(dst), _cell_edges(src)
        return sum(np.maximum(0.0, np.minimum(b[:, None], d[None, :] + k)
                              - np.maximum(a[:, None], c[None, :] + k)) for k in (-360, 0, 360))

    w_lat, w_lon = lat_weights(lat, new_lat), lon_weights(lon, new_lon)
    want = np.einsum("ip,jq,spq->sij", w_lat, w_lon, ref)
    want /= (w_lat.sum(1)[:, None] * w_lon.sum(1)[None, :])
    # The area integral of each field is kept (both grids cover the whole sphere).
    def area(la, lo):
        (a, b), (c, d) = (np.clip(e, -90, 90) for e in _cell_edges(la)), _cell_edges(lo)
        return np.outer(np.abs(np.sin(np.radians(b)) - np.sin(np.radians(a))), d - c)

    np.testing.assert_allclose((want * area(new_lat, new_lon)).sum((1, 2)),
                               (ref * area(lat, lon)).sum((1, 2)), rtol=1e-12)
    with isb.InSituDataset(store, None, isb.open_geometries(store, ["t2m"]), batch_size=5,
                           chunk_transforms=[Regrid((0, 1), (lat, lon), (new_lat, new_lon),
                                                    method="conservative", sphere=True)]) as ds:
        assert ds.sample_formats["t2m"] == ((4, 8), np.dtype("float32"))
        assert check(ds, "t2m", want.astype(np.float32)) == 12
    # What it refuses, by name.
    with pytest.raises(isb.InvalidArgument, match="at least 2 `dst`"):
        isb.InSituDataset(store, chunk_transforms=[applies("t2m", Regrid(
            (0, 1), (lat, lon), (new_lat[:1], new_lon), method="conservative"))])
    with pytest.raises(isb.InvalidArgument, match="`sphere`"):
        isb.InSituDataset(store, chunk_transforms=[applies("t2m", Regrid(
            (0, 1), (lat, lon), (new_lat, new_lon), sphere=True))])
    with pytest.raises(TypeError, match="sphere must be a bool"):
        isb.InSituDataset(store, chunk_transforms=[Regrid((0, 1), (lat, lon), (new_lat, new_lon),
                                                          method="conservative", sphere="yes")])
