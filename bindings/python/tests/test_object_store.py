"""Object stores through the shim: a local S3 server (moto) holding zarr-python's fixtures, read
with signed requests by the same client that reads AWS S3. Every sample equals zarr-python's,
the batches equal the local store's, and a missing bucket or object names its URL."""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

import insitubatch as isb

boto3 = pytest.importorskip("boto3", reason="pip install -r requirements-test.txt (moto[server])")

CREDENTIALS = {
    "aws_access_key_id": "testing",
    "aws_secret_access_key": "testing",
    "aws_region": "us-east-1",
}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(fixtures):
    """A moto S3 server with a bucket `data` holding the fixture stores; yields its options."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=CREDENTIALS["aws_access_key_id"],
            aws_secret_access_key=CREDENTIALS["aws_secret_access_key"],
            region_name=CREDENTIALS["aws_region"],
        )
        client.create_bucket(Bucket="data")
        out, _ = fixtures
        for store in ("era5_v3.zarr", "era5_v2.zarr", "v3_sharded.zarr", "v3_sharded_start.zarr"):
            for dirpath, _, files in os.walk(out / store):
                for name in files:
                    path = os.path.join(dirpath, name)
                    client.upload_file(path, "data", os.path.relpath(path, out))
        yield {**CREDENTIALS, "aws_endpoint": endpoint, "aws_allow_http": True}
    finally:
        server.kill()
        server.wait()


def _epoch(ds, split="train"):
    """(sample indices, {label: array}) of a whole epoch, batches concatenated."""
    order, arrays = [], {}
    for b in getattr(ds, split):
        order.extend(b.sample_indices.tolist())
        for label, a in b.arrays.items():
            arrays.setdefault(label, []).append(np.array(a))
    return order, {k: np.concatenate(v) for k, v in arrays.items()}


@pytest.mark.parametrize("store", ["era5_v3.zarr", "era5_v2.zarr"])
def test_a_store_in_s3_reads_as_zarr_python_and_the_local_copy(fixtures, s3, store):
    # era5_v3 has consolidated metadata; era5_v2 has none, so its arrays are found by listing.
    out, _ = fixtures
    kw = dict(batch_size=5, block_chunks=2, seed=3)
    # Three client threads (insitubatch's own option, a number beside the crate's strings).
    opts = {**s3, "client_threads": 3}
    with isb.InSituDataset(f"s3://data/{store}", storage_options=opts, **kw) as remote, \
            isb.InSituDataset(out / store, **kw) as local:
        assert set(remote.geometries) == {"t2m", "u10", "station"}
        got_order, got = _epoch(remote)
        want_order, want = _epoch(local)
        assert got_order == want_order
        assert sorted(got_order) == list(range(12))
        for label in ("t2m", "u10", "station"):
            np.testing.assert_array_equal(got[label], want[label])
            ref = zarr.open_array(out / store / label, mode="r")[...]
            np.testing.assert_array_equal(got[label], ref[got_order])
        assert remote.stats()["tiles_read"] == local.stats()["tiles_read"]
    # A region in coordinate values reads the coordinate arrays from the bucket (the
    # geometry carries the options), and is the local copy's region.
    g = isb.open_geometries(f"s3://data/{store}", storage_options=s3)["t2m"]
    europe = dict(latitude=(67.5, 0), longitude=(-25, 45), periodic={"longitude": 360})
    local_g = isb.open_geometries(out / store)["t2m"]
    assert g.crop_coords(**europe).region == local_g.crop_coords(**europe).region == ((1, 5), (15, 19))
    # Each sample's time, read from the bucket by the dataset with its options.
    with isb.InSituDataset(f"s3://data/{store}", storage_options=s3) as remote:
        np.testing.assert_array_equal(remote.coordinates("t2m"),
                                      zarr.open_array(out / store / "time", mode="r")[...])
    np.testing.assert_array_equal(
        isb.coordinate_values(f"s3://data/{store}", "u10", "latitude", storage_options=s3),
        isb.coordinate_values(out / store, "u10", "latitude"))


def test_a_sharded_root_array_in_s3_reads_as_zarr_python(fixtures, s3):
    out, _ = fixtures
    ref = zarr.open_array(out / "v3_sharded.zarr", mode="r")[...]
    with isb.InSituDataset("s3://data/v3_sharded.zarr", storage_options=s3, batch_size=4) as ds:
        order, got = _epoch(ds, "all")
        assert order == list(range(ref.shape[0]))
        (arr,) = got.values()
        np.testing.assert_array_equal(arr, ref)


@pytest.mark.parametrize("store", ["v3_sharded.zarr", "v3_sharded_start.zarr"])
def test_a_region_of_a_sharded_array_in_s3_reads_its_index_and_touched_inner_chunks(fixtures, s3, store):
    # Shards of (4, 6, 8) in inner chunks of (2, 3, 4); rows 3..6, columns 4..8 touch a quarter
    # of each shard's inner chunks (v3_sharded_start: index first, one inner chunk absent).
    out, _ = fixtures
    ref = zarr.open_array(out / store, mode="r")[...]
    region = (slice(3, 6), slice(4, 8))
    views = {}
    for where in (f"s3://data/{store}", out / store):
        options = s3 if isinstance(where, str) else None
        g = isb.open_geometries(where, storage_options=options)[""].crop(*region)
        with isb.InSituDataset(where, None, {"x": g}, batch_size=4, storage_options=options) as ds:
            order, got = _epoch(ds, "all")
            assert order == list(range(ref.shape[0]))
            np.testing.assert_array_equal(got["x"], ref[:, 3:6, 4:8])
            views[where if isinstance(where, str) else "local"] = ds.stats()["bytes_read"]
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out / store / "c") for f in fs)
    assert views[f"s3://data/{store}"] == views["local"] < on_disk


def test_a_missing_bucket_or_store_names_its_url_and_bad_options_are_refused(s3):
    with pytest.raises(isb.errors.Error, match="s3://data/nothing_here.zarr"):
        isb.InSituDataset("s3://data/nothing_here.zarr", storage_options=s3)
    with pytest.raises(isb.errors.Error, match="s3://no-such-bucket/era5_v3.zarr"):
        isb.InSituDataset("s3://no-such-bucket/era5_v3.zarr", storage_options=s3)
    with pytest.raises(isb.errors.InvalidArgument, match="aws_no_such_option"):
        isb.InSituDataset("s3://data/era5_v3.zarr", storage_options={"aws_no_such_option": "1"})
    with pytest.raises(isb.errors.InvalidArgument, match="`client_threads` = \"0\".* 1 to 64"):
        isb.InSituDataset("s3://data/era5_v3.zarr", storage_options={**s3, "client_threads": 0})
    with pytest.raises(TypeError, match="storage_options"):
        isb.InSituDataset("s3://data/era5_v3.zarr", storage_options={"aws_region": ["a"]})
    with pytest.raises(TypeError, match="storage_options"):
        isb.InSituDataset("s3://data/era5_v3.zarr", storage_options="aws_region=us-east-1")


def test_a_persisted_cache_of_an_s3_store_serves_a_later_run_with_no_request(fixtures, s3, tmp_path):
    # The product's promise for object stores: the first run fetches and decodes, the NVMe
    # tier keeps the decoded chunks, and a later run (readonly, as a scoring job) reads nothing
    # from the store. t2m's chunks are deleted from the bucket for the second run: a read that
    # reached the store would find no object, read the fill value and fail the comparison.
    out, _ = fixtures
    url = "s3://data/era5_v3.zarr"
    with isb.InSituDataset(url, storage_options=s3, batch_size=4, cache_dir=tmp_path,
                           persist=True) as ds:
        first_order, first = _epoch(ds, "all")
        assert ds.stats()["tiles_read"] == 9  # 3 chunks of each of 3 variables
    client = boto3.client("s3", endpoint_url=s3["aws_endpoint"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    listed = client.list_objects_v2(Bucket="data", Prefix="era5_v3.zarr/t2m/c/")["Contents"]
    for obj in listed:
        client.delete_object(Bucket="data", Key=obj["Key"])
    try:
        with isb.InSituDataset(url, storage_options=s3, batch_size=4, cache_dir=tmp_path,
                               readonly_cache=True) as ds:
            order, got = _epoch(ds, "all")
            s = ds.stats()
            assert (s["tiles_read"], s["bytes_decoded"], ds.cache_revived) == (0, 0, 9)
        assert order == first_order
        for label in ("t2m", "u10", "station"):
            np.testing.assert_array_equal(got[label], first[label])
            ref = zarr.open_array(out / "era5_v3.zarr" / label, mode="r")[...]
            np.testing.assert_array_equal(got[label], ref)
    finally:
        for obj in listed:
            client.upload_file(str(out / obj["Key"]), "data", obj["Key"])


def test_geometries_splits_and_the_cli_take_storage_options(fixtures, s3, tmp_path):
    # Nothing in the environment points at the server: every call gets its options.
    out, _ = fixtures
    url = "s3://data/era5_v3.zarr"
    geoms = isb.open_geometries(url, storage_options=s3)
    assert set(geoms) == {"t2m", "u10", "station"}
    assert geoms["t2m"].storage_options["aws_endpoint"] == s3["aws_endpoint"]
    manifest = isb.split_by_chunk(geoms["t2m"], (0.34, 0.33, 0.33))  # reopens the store
    assert sorted(c for cs in manifest.splits.values() for c in cs) == [0, 1, 2]
    ref = zarr.open_array(out / "era5_v3.zarr" / "t2m", mode="r")[...]
    views = {"x": geoms["t2m"], "y": geoms["t2m"].shift(1)}  # options carried by the geometries
    with isb.InSituDataset(url, manifest, views, batch_size=2) as ds:
        seen = 0
        for b in ds.train:
            for label in ("x", "y"):
                for r, idx in enumerate(b.read_indices(label)):
                    np.testing.assert_array_equal(b.arrays[label][r], ref[idx])
            seen += len(b)
        assert seen == ds.train.n_samples > 0
    # Splits by ranges reopen the store with the geometry's options; a date reads the time
    # coordinate from the bucket (these fixtures' has no units, which the refusal says).
    by_range = isb.split_by_ranges(geoms["t2m"], {"train": (0, 8), "test": (8, 12)})
    assert by_range.splits == {"train": [0, 1], "test": [2]}
    with pytest.raises(isb.InvalidArgument, match="give sample indices"):
        isb.split_by_ranges(geoms["t2m"], {"train": ("1979-01-01", 8)})
    # Statistics of the bucket's train split are the local copy's.
    with isb.InSituDataset(url, by_range, storage_options=s3) as remote, \
            isb.InSituDataset(out / "era5_v3.zarr", by_range) as local:
        got, want = remote.statistics("train", axis=0), local.statistics("train", axis=0)
        assert got.keys() == want.keys() == {"t2m", "u10", "station"}
        for name in got:
            for field in ("count", "nan_count", "mean", "std", "min", "max"):
                np.testing.assert_array_equal(getattr(got[name], field), getattr(want[name], field))
    with pytest.raises(isb.InvalidArgument, match="aws_"):
        isb.open_geometries(out / "era5_v3.zarr", storage_options=s3)

    # The CLI: --storage-option KEY=VALUE, repeated.
    binary = os.path.join(os.path.dirname(__file__), "../../../target/release/insitubatch")
    if not os.path.exists(binary):
        pytest.skip("needs `cargo build --release`")
    flags = []
    for k, v in s3.items():
        flags += ["--storage-option", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    report = subprocess.run([binary, "inspect", url, "--json", *flags], check=True,
                            capture_output=True, text=True, env=env)
    paths = {v["path"] for v in json.loads(report.stdout)["variables"]}
    assert paths == {"t2m", "u10", "station"}
    check = subprocess.run(
        [binary, "check-transform", url, "--var", "t2m", "--transform",
         '{"type": "affine", "offset": 1.5}', "--json", *flags],
        check=True, capture_output=True, text=True, env=env,
    )
    r = json.loads(check.stdout)
    assert abs(r["after"]["min"] - r["before"]["min"] - 1.5) < 1e-4, r
    refused = subprocess.run([binary, "inspect", url, "--storage-option", "aws_nope=1"],
                             capture_output=True, text=True, env=env)
    assert refused.returncode != 0 and "aws_nope" in refused.stderr
