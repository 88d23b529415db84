"""insitubatch.augment: random crops against the stored values, one window for every label, draws
that depend on (seed, epoch, sample) only, periodic axes, and bad arguments."""

import numpy as np
import pytest
import zarr

import insitubatch as isb
from insitubatch.augment import RandomCrop, sample_random_bits

T, L, H, W = 24, 3, 10, 12


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Random (not smooth) values, so that a window matches the source at one place only."""
    path = tmp_path_factory.mktemp("augment") / "fields.zarr"
    rng = np.random.default_rng(7)
    g = zarr.open_group(path, mode="w", zarr_format=3)
    values = {
        "field": rng.standard_normal((T, L, H, W)).astype("float32"),  # (time, level, lat, lon)
        "mask": rng.integers(0, 255, (T, H, W)).astype("uint8"),
        "chl": rng.standard_normal((T, H, W, 2)).astype("float32"),  # channels last
    }
    for name, v in values.items():
        a = g.create_array(name, shape=v.shape, chunks=(4,) + v.shape[1:], dtype=v.dtype)
        a[...] = v
    return str(path), values


def batches(store, geometries, epoch=0, **kw):
    ds = isb.InSituDataset(store, geometries=geometries, **kw)
    ds.set_epoch(epoch)
    return list(ds.train)


def test_each_label_is_cut_at_one_origin_per_sample(store):
    path, ref = store
    g = isb.open_geometries(path)
    crop = RandomCrop((5, 6), labels=["x", "y", "mask"], seed=3)
    found = []
    for b in batches(path, {"x": g["field"], "y": g["field"].shift(2), "mask": g["mask"],
                            "chl": g["chl"]}, epoch=4, batch_size=5):
        assert b.epoch == 4
        origins = crop.origins(b)
        uncropped = b.arrays["chl"]
        out = crop(b)
        assert out.arrays["chl"] is uncropped  # not in `labels`: left alone
        assert out.arrays["x"].shape == (len(b), L, 5, 6) and out.arrays["mask"].shape == (len(b), 5, 6)
        for r, s in enumerate(out.sample_indices):
            i, j = origins[r]
            assert 0 <= i <= H - 5 and 0 <= j <= W - 6
            np.testing.assert_array_equal(out.arrays["x"][r], ref["field"][s, :, i:i + 5, j:j + 6])
            np.testing.assert_array_equal(out.arrays["y"][r], ref["field"][s + 2, :, i:i + 5, j:j + 6])
            np.testing.assert_array_equal(out.arrays["mask"][r], ref["mask"][s, i:i + 5, j:j + 6])
            # No other origin gives this window (the values are random): it is the one reported.
            matches = [(a, c) for a in range(H - 4) for c in range(W - 5)
                       if np.array_equal(ref["mask"][s, a:a + 5, c:c + 6], out.arrays["mask"][r])]
            assert matches == [(i, j)]
            found.append((i, j))
        for a in out.arrays.values():
            assert a.flags["C_CONTIGUOUS"]
    assert len(set(found)) > 5, found  # the origins vary from sample to sample
    # Over a few epochs every origin along each axis comes up, the last one included.
    for epoch in range(5):
        for b in batches(path, {"mask": g["mask"]}, epoch=epoch, batch_size=T):
            found.extend(map(tuple, RandomCrop((5, 6), seed=3).origins(b)))
    assert {i for i, _ in found} == set(range(H - 4)) and {j for _, j in found} == set(range(W - 5))


def check_crops(path, label, geometry, crop, want, epochs=(0,)):
    """Crops every batch of a few epochs of `label` alone, checks each row against
    `want(sample, origin)`, and returns the origins."""
    found = []
    for epoch in epochs:
        for b in batches(path, {label: geometry}, epoch=epoch, batch_size=6):
            origins = crop.origins(b)
            out = crop(b)
            for r, s in enumerate(out.sample_indices):
                np.testing.assert_array_equal(out.arrays[label][r], want(s, *origins[r]))
                found.append(tuple(origins[r]))
    return found


def test_axes_other_than_the_last_and_a_periodic_axis(store):
    path, ref = store
    g = isb.open_geometries(path)
    # Channels last: crop the two axes before it.
    check_crops(path, "chl", g["chl"], RandomCrop((5, 6), labels=["chl"], axes=(0, 1), seed=1),
                lambda s, i, j: ref["chl"][s, i:i + 5, j:j + 6])
    # Longitude periodic: a window of 8 may start anywhere and run past the end.
    found = check_crops(
        path, "mask", g["mask"], RandomCrop((4, 8), wrap=(False, True), seed=2),
        lambda s, i, j: np.take(ref["mask"][s, i:i + 4], np.arange(j, j + 8) % W, axis=1),
        epochs=range(4))
    assert all(0 <= i <= H - 4 and 0 <= j < W for i, j in found)
    assert any(j + 8 > W for _, j in found)
    # A periodic first axis beside a bounded one, channels last.
    found = check_crops(
        path, "chl", g["chl"],
        RandomCrop((7, 6), labels=["chl"], axes=(0, 1), wrap=(True, False), seed=4),
        lambda s, i, j: np.take(ref["chl"][s, :, j:j + 6], np.arange(i, i + 7) % H, axis=0),
        epochs=range(2))
    assert all(0 <= i < H and 0 <= j <= W - 6 for i, j in found)
    assert any(i + 7 > H for i, _ in found)


def test_the_draw_depends_on_seed_epoch_and_sample_only(store):
    path, _ = store
    g = {"mask": isb.open_geometries(path)["mask"]}

    def crops(epoch, seed=0, **kw):
        crop = RandomCrop((3, 3), seed=seed)
        out = {}
        for b in batches(path, g, epoch=epoch, batch_transforms=[crop], **kw):
            for r, s in enumerate(b.sample_indices):
                out[int(s)] = b.arrays["mask"][r].copy()
        return out

    base = crops(1, batch_size=4)
    assert len(base) == T
    # Another batch size, no shuffle, two ranks, a resumed epoch: each sample cut the same way.
    for other in (crops(1, batch_size=7, shuffle=False),
                  {**crops(1, batch_size=5, rank=0, world_size=2, even_train=False),
                   **crops(1, batch_size=5, rank=1, world_size=2, even_train=False)}):
        assert other.keys() == base.keys()
        assert all(np.array_equal(other[s], base[s]) for s in base)
    ds = isb.InSituDataset(path, geometries=g, batch_size=4,
                           batch_transforms=[RandomCrop((3, 3))])
    ds.set_epoch(1)
    for b in ds.train.from_batch(2):
        assert b.epoch == 1
        for r, s in enumerate(b.sample_indices):
            assert np.array_equal(b.arrays["mask"][r], base[int(s)])
    # Another epoch or another seed: other windows for most samples.
    for other in (crops(2, batch_size=4), crops(1, seed=9, batch_size=4)):
        assert sum(not np.array_equal(other[s], base[s]) for s in base) > T // 2


def test_random_bits_are_uniform_and_independent_across_streams():
    bits = sample_random_bits(0, 0, np.arange(60_000), streams=2)
    assert bits.shape == (60_000, 2) and bits.dtype == np.uint64
    counts = np.bincount((bits[:, 0] % 6).astype(np.int64), minlength=6)
    assert np.all(np.abs(counts / 60_000 - 1 / 6) < 0.01), counts
    # The two streams of a sample are not the same draw, nor correlated.
    a, b = (bits % 1000).astype(np.float64).T
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02
    np.testing.assert_array_equal(sample_random_bits(0, 0, [5, 3]), bits[[5, 3], :1])
    assert not np.array_equal(sample_random_bits(0, 1, [5]), bits[[5], :1])
    assert not np.array_equal(sample_random_bits(1, 0, [5]), bits[[5], :1])


def test_bad_arguments_name_what_is_wrong(store):
    path, _ = store
    g = isb.open_geometries(path)
    (b,) = batches(path, {"x": g["field"], "mask": g["mask"], "s": g["field"]}, batch_size=T)[:1]
    with pytest.raises(ValueError, match=r"window of 11 does not fit field axis 0 of 'mask', of "
                                         r"length 10"):
        RandomCrop((11, 2), labels=["mask"]).origins(b)
    with pytest.raises(ValueError, match=r"window of 4 does not fit field axis 0 of 'x', of "
                                         r"length 3"):
        RandomCrop((4, 2), labels=["x"], axes=(0, 1)).origins(b)
    with pytest.raises(KeyError, match="nope"):
        RandomCrop((2, 2), labels=["nope"])(b)
    with pytest.raises(ValueError, match=r"labels 'x' and 'mask' differ along the cropped axes"):
        RandomCrop((2, 2), labels=["x", "mask"], axes=(0, 1))(b)
    with pytest.raises(ValueError, match=r"label 'mask' has 2 field axes; cannot crop axes"):
        RandomCrop((2, 2, 2))(b)
    with pytest.raises(ValueError, match="must be at least 1"):
        RandomCrop((0, 2))
    with pytest.raises(ValueError, match="`wrap` must be a bool or 2 bools"):
        RandomCrop((2, 2), wrap=(True,))
    with pytest.raises(ValueError, match="2 axes for a 1-axis `size`"):
        RandomCrop(2, axes=(0, 1))
    with pytest.raises(ValueError, match="non-empty list of labels"):
        RandomCrop(2, labels="mask")
    with pytest.raises(ValueError, match="must not be negative"):
        sample_random_bits(0, 0, [-1])


def test_the_example_in_the_python_docs_runs(tmp_path, python_docs_example):
    """docs/python-api.md, "Random crops": its example as printed, on a store of its own."""
    code = python_docs_example("## Random crops")
    path = tmp_path / "era5.zarr"
    g = zarr.open_group(path, mode="w", zarr_format=3)
    t2m = np.random.default_rng(1).standard_normal((100, 72, 96)).astype("float32")
    g.create_array("t2m", shape=t2m.shape, chunks=(4, 72, 96), dtype="float32")[...] = t2m
    scope = {"isb": isb, "store": str(path)}
    exec(code, scope)
    x, y = scope["x"], scope["y"]  # the last batch of the epoch
    assert x.shape[1:] == y.shape[1:] == (64, 64) and 0 < len(x) <= 64
    # y is x six steps on, cut at the same place: its window is found in t2m at x's origin.
    batch = scope["batch"]
    for r, s in enumerate(batch.sample_indices):
        hits = [(i, j) for i in range(72 - 63) for j in range(96 - 63)
                if np.array_equal(t2m[s, i:i + 64, j:j + 64], x[r])]
        assert len(hits) == 1
        i, j = hits[0]
        np.testing.assert_array_equal(y[r], t2m[s + 6, i:i + 64, j:j + 64])
