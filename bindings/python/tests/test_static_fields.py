"""Static fields (`ArrayGeometry.as_static()`): an array without a sample axis (orography) is
zarr-python's whole array (or its region) in every row, alone or as a channel of a stack, and
what cannot be a static field is refused by name."""

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
    g = isb.open_geometries(store, ["field", "orog", "orog_sharded"])
    ref = {name: zarr.open_array(store / name, mode="r")[...] for name in g}
    return store, g, ref


def test_a_static_field_is_the_whole_array_in_every_row_and_a_channel_of_a_stack(fixtures):
    store, g, ref = stores(fixtures)
    views = {"x": g["field"], "x_next": g["field"].shift(1),
             "orog": g["orog"].as_static(), "sharded": g["orog_sharded"].as_static()}
    with isb.InSituDataset(store, None, views, stacks={"inputs": ["orog", "x", "sharded"]},
                           batch_size=4, seed=3) as ds:
        assert ds.array_formats["inputs"][0] == (3, 9, 16)
        assert ds.geometries["orog"].static and ds.geometries["orog"].shape == (9, 16)
        anchors = []
        for b in ds.train:
            x = b.arrays["inputs"]
            np.testing.assert_array_equal(x[:, 0], np.broadcast_to(ref["orog"], x[:, 0].shape))
            np.testing.assert_array_equal(x[:, 1], ref["field"][b.read_indices("x")])
            np.testing.assert_array_equal(x[:, 2], np.broadcast_to(ref["orog_sharded"], x[:, 2].shape))
            np.testing.assert_array_equal(b.arrays["x_next"], ref["field"][b.read_indices("x") + 1])
            anchors += b.sample_indices.tolist()
        # The window drops the last anchor; the static fields drop none.
        assert sorted(anchors) == list(range(9))
        # The dataset's own geometries open the same dataset again.
        with isb.InSituDataset(store, None, ds.geometries, stacks=ds.stacks, batch_size=4) as again:
            assert again.geometries == ds.geometries


def test_a_cropped_static_field_is_its_region(fixtures):
    store, g, ref = stores(fixtures)
    views = {"x": g["field"].crop((2, 7), (-4, 3), wrap=True),
             "orog": g["orog"].as_static().crop((2, 7), (-4, 3), wrap=True)}
    with isb.InSituDataset(store, None, views, stacks={"s": ["x", "orog"]}, batch_size=5) as ds:
        cols = list(range(12, 16)) + list(range(0, 3))
        for b in ds.all:
            s = b.arrays["s"]
            assert s.shape[1:] == (2, 5, 7)
            np.testing.assert_array_equal(s[:, 1], np.broadcast_to(ref["orog"][2:7][:, cols], s[:, 1].shape))
            np.testing.assert_array_equal(s[:, 0], ref["field"][b.sample_indices][:, 2:7][:, :, cols])


def test_what_cannot_be_a_static_field_is_refused_by_name(fixtures):
    store, g, _ = stores(fixtures)
    orog = g["orog"].as_static()
    with pytest.raises(errors.InvalidArgument, match="no window to shift"):
        orog.shift(1)
    with pytest.raises(errors.InvalidArgument, match="shifted by 2"):
        g["field"].shift(2).as_static()
    with pytest.raises(errors.InvalidArgument, match="2 for axes \\[0, 1\\] \\(a static field"):
        orog.crop((0, 4))
    with pytest.raises(errors.InvalidArgument, match="to split"):
        isb.split_by_chunk(orog)
    with pytest.raises(errors.InvalidArgument, match="every variable is a static field"):
        isb.InSituDataset(store, None, {"o": orog})
    with pytest.raises(errors.InvalidArgument, match="one as a static field"):
        isb.InSituDataset(store, None, {"x": g["field"], "f": g["field"].as_static()})
    with isb.InSituDataset(store, None, {"x": g["field"], "o": orog}) as ds:
        with pytest.raises(errors.InvalidArgument, match="static field.*name the dimension"):
            ds.coordinates("o")


def test_the_static_fields_example_in_the_python_docs_gives_what_it_prints(tmp_path, python_docs_example):
    """docs/python-api.md, "Static fields": its example as printed, on a small ERA5-like store
    with an orography and a land-sea mask added by zarr-python."""
    code = python_docs_example("## Static fields")
    store = tmp_path / "era5.zarr"
    exe = Path(__file__).resolve().parents[3] / "target" / "release" / "insitubatch"
    subprocess.run([str(exe), "make-dataset", str(store), "--samples", "40", "--sample-chunk", "4",
                    "--variables", "t2m,u10"], check=True, capture_output=True)
    rng = np.random.default_rng(0)
    group = zarr.open_group(store, mode="a")
    orography = rng.normal(size=(181, 360)).astype("f4")
    lsm = (rng.random((181, 360)) > 0.7).astype("f4")
    group.create_array("orography", data=orography, chunks=(91, 180))
    group.create_array("lsm", data=lsm, chunks=(181, 360))
    zarr.consolidate_metadata(store)
    scope = {"isb": isb, "store": str(store)}
    exec(code, scope)
    b, x = scope["b"], scope["x"]
    assert x.shape == (32, 4, 181, 360)
    t2m = zarr.open_array(store / "t2m", mode="r")
    np.testing.assert_array_equal(x[:, 0], t2m.oindex[b.read_indices("t2m")])
    np.testing.assert_array_equal(x[:, 2], np.broadcast_to(orography, (32, 181, 360)))
    np.testing.assert_array_equal(x[:, 3], np.broadcast_to(lsm, (32, 181, 360)))
    scope["ds"].close()
