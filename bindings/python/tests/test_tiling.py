"""insitubatch.tiling.Stitcher: a grid's tiles, put back, give every field of zarr-python's
array (overlaps averaged, weighted or not, periodic axes wrapped), each once and as soon as its
last tile is in; what cannot be stitched is refused by name."""

import numpy as np
import pytest
import zarr

import insitubatch as isb
from insitubatch import errors
from insitubatch.tiling import Stitcher


def field_store(fixtures):
    out, _ = fixtures
    store = out / "statics.zarr"
    g = isb.open_geometries(store, ["field"])["field"]
    return store, g, zarr.open_array(store / "field", mode="r")[...]


@pytest.mark.parametrize("split", ["all", "train"])
def test_every_field_comes_back_once_as_soon_as_its_tiles_are_in(fixtures, split):
    store, g, ref = field_store(fixtures)
    with isb.InSituDataset(store, None, {"x": g}, patch=(4, 6), patch_grid=(2, 3),
                           batch_size=7, seed=3) as ds:
        stitcher = Stitcher(ds)
        got, most_pending = {}, 0
        for b in getattr(ds, split):
            x = b.arrays["x"].astype(np.float64)
            # Two output channels: the input and an affine function of it.
            pred = np.stack([x, 2 * x + 1], axis=1)
            for s, field in stitcher.add(b, pred):
                assert s not in got, f"sample {s} twice"
                assert s not in stitcher.pending
                got[s] = field
            most_pending = max(most_pending, len(stitcher.pending))
        stitcher.close()
        assert sorted(got) == list(range(10))
        for s, field in got.items():
            assert field.shape == (2, 9, 16) and field.dtype == np.float32
            np.testing.assert_array_equal(field[0], ref[s])
            np.testing.assert_array_equal(field[1], (2 * ref[s].astype(np.float64) + 1).astype("f4"))
        if split == "all":
            assert most_pending <= 2, "in order, one or two fields at a time"


def test_weighted_overlaps_and_a_periodic_axis(fixtures):
    store, g, ref = field_store(fixtures)
    weight = np.outer(np.hanning(6)[1:5] + 0.1, np.hanning(8)[1:7] + 0.1)
    with isb.InSituDataset(store, None, {"x": g}, patch=(4, 6), patch_wrap=(False, True),
                           patch_grid=(3, 4), batch_size=5) as ds:
        assert ds.patches_per_sample == 3 * 4
        stitcher = Stitcher(ds, weight=weight, dtype=np.float64)
        got = {}
        for b in ds.all:
            got.update(stitcher.add(b, b.arrays["x"]))
        stitcher.close()
        assert sorted(got) == list(range(10))
        for s, field in got.items():
            assert field.dtype == np.float64
            np.testing.assert_allclose(field, ref[s], rtol=1e-6)


def test_what_cannot_be_stitched_is_refused(fixtures):
    store, g, _ = field_store(fixtures)
    with isb.InSituDataset(store, None, {"x": g}, patch=(4, 6), patches_per_sample=2) as drawn:
        with pytest.raises(errors.InvalidArgument, match="no `patch_grid`"):
            Stitcher(drawn)
    with isb.InSituDataset(store, None, {"x": g}, patch=(4, 6), patch_grid=True,
                           batch_size=4) as ds:
        with pytest.raises(ValueError, match="shaped like the patch \\(4, 6\\)"):
            Stitcher(ds, weight=np.ones((6, 4)))
        with pytest.raises(ValueError, match="above zero"):
            Stitcher(ds, weight=np.zeros((4, 6)))
        stitcher = Stitcher(ds)
        b = next(iter(ds.all))
        with pytest.raises(ValueError, match="with 4 rows, one per tile"):
            stitcher.add(b, b.arrays["x"][:3])
        with pytest.raises(ValueError, match="4, 6"):
            stitcher.add(b, b.arrays["x"][:, :3])
        assert stitcher.add(b, b.arrays["x"]) == []
        # 3 x 3 tiles per field: the first four rows are four of sample 0's.
        assert stitcher.pending == [0]
        with pytest.raises(errors.InvalidArgument,
                           match="1 of the fields never got all of their 9 tiles .* \\{0: 5\\}"):
            stitcher.close()
