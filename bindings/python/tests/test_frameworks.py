"""torch and JAX get the batch without a copy, and a tiny torch model trains from as_torch."""

import numpy as np
import pytest

import insitubatch as isb
from insitubatch.frameworks import as_torch, to_jax, to_torch


def test_torch_shares_the_data_pointer_and_trains_two_epochs(fixtures):
    torch = pytest.importorskip("torch")
    store = fixtures[0] / "era5_v3.zarr"
    with isb.InSituDataset(store, batch_size=4) as ds:
        b = next(iter(ds.train))
        t = to_torch(b)
        for label, arr in b.arrays.items():
            assert t[label].data_ptr() == arr.__array_interface__["data"][0]
        model = torch.nn.Linear(9 * 16, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)
        loader = torch.utils.data.DataLoader(as_torch(ds.train), batch_size=None, num_workers=0)
        assert len(loader) == 3, "12 samples in batches of 4"
        steps = 0
        for epoch in range(2):
            ds.set_epoch(epoch)
            for batch in loader:
                x = batch["t2m"].reshape(batch["t2m"].shape[0], -1)
                loss = (model(x).squeeze(1) - batch["u10"].mean(dim=(1, 2))).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
        assert steps == 6 and np.isfinite(loss.item())


def test_a_stack_reaches_torch_as_one_channels_tensor_without_a_copy(fixtures):
    torch = pytest.importorskip("torch")
    store = fixtures[0] / "era5_v3.zarr"
    with isb.InSituDataset(store, batch_size=4, stacks={"x": ["t2m", "u10"]}) as ds:
        b = next(iter(ds.train))
        t = to_torch(b)
        assert set(t) == {"x", "station"}
        assert t["x"].shape == (4, 2, 9, 16) and t["x"].is_contiguous()
        assert t["x"].data_ptr() == b.arrays["x"].__array_interface__["data"][0]
        conv = torch.nn.Conv2d(2, 1, 3, padding=1)
        assert conv(t["x"]).shape == (4, 1, 9, 16)


def test_as_torch_resumes_its_first_epoch_at_start_batch_then_runs_whole_ones(fixtures):
    torch = pytest.importorskip("torch")
    store = fixtures[0] / "era5_v3.zarr"
    with isb.InSituDataset(store, batch_size=4, seed=1) as ds:
        ds.set_epoch(3)
        whole = [b.sample_indices.tolist() for b in ds.train]
        resumed = as_torch(ds.train, start_batch=1)
        loader = torch.utils.data.DataLoader(resumed, batch_size=None, num_workers=0)
        assert len(loader) == len(whole) - 1
        first = [b["t2m"].numpy().copy() for b in loader]
        rest = [b.arrays["t2m"].copy() for b in ds.train.from_batch(1)]
        assert len(first) == len(rest) == len(whole) - 1
        assert all(np.array_equal(a, b) for a, b in zip(first, rest)), "the epoch's batches 1.."
        # The DataLoader's next epoch is a whole one.
        assert len(loader) == len(whole) and len(list(loader)) == len(whole)
        with pytest.raises(isb.InvalidArgument, match="`start_batch` = -1"):
            as_torch(ds.train, start_batch=-1)


def test_a_device_transform_runs_on_each_batch_once_it_is_on_the_device(fixtures):
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    store = fixtures[0] / "era5_v3.zarr"
    calls = []

    def wind_speed(t):
        calls.append({k: v.device for k, v in t.items()})
        return {"t2m_c": t["t2m"] - 273.15, "speed": t["u10"].abs()}

    with isb.InSituDataset(store, batch_size=4, shuffle=False) as ds:
        expected = [(b.arrays["t2m"].copy(), b.arrays["u10"].copy()) for b in ds.train]
        got = list(as_torch(ds.train, device="cpu", device_transform=wind_speed))
        assert len(got) == len(expected) == len(calls) == 3
        assert all(set(c) == {"station", "t2m", "u10"} for c in calls)
        assert all(d == torch.device("cpu") for c in calls for d in c.values())
        for (t2m, u10), out in zip(expected, got):
            np.testing.assert_array_equal(out["t2m_c"].numpy(), torch.from_numpy(t2m).sub(273.15).numpy())
            np.testing.assert_array_equal(out["speed"].numpy(), np.abs(u10))
        b = next(iter(ds.train))
        assert to_torch(b, device_transform=lambda t: sorted(t)) == ["station", "t2m", "u10"]
        jitted = jax.jit(lambda t: t["u10"].sum())
        assert float(to_jax(b, device_transform=jitted)) == pytest.approx(float(b.arrays["u10"].sum()), rel=1e-6)
        for adapter in (lambda: to_torch(b, device_transform=3), lambda: to_jax(b, device_transform="x"),
                        lambda: as_torch(ds.train, device_transform=[])):
            with pytest.raises(TypeError, match="`device_transform` must be a function"):
                adapter()


def test_jax_import_shares_the_buffer(fixtures):
    jax = pytest.importorskip("jax")
    store = fixtures[0] / "era5_v3.zarr"
    with isb.InSituDataset(store, batch_size=4) as ds:
        b = next(iter(ds.train))
        j = to_jax(b)
        for label, arr in b.arrays.items():
            np.testing.assert_array_equal(np.asarray(j[label]), arr)
            ptr = j[label].unsafe_buffer_pointer()
            assert ptr == arr.__array_interface__["data"][0]


def test_as_torch_in_a_dataloader_worker_says_to_use_num_workers_0(fixtures, monkeypatch):
    torch = pytest.importorskip("torch")
    store = fixtures[0] / "era5_v3.zarr"
    with isb.InSituDataset(store, batch_size=4) as ds:
        # Inside a worker process (simulated: forking a real worker here would fork JAX's and
        # the runtime's threads too), iterating says what to do instead of failing obscurely.
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
        with pytest.raises(isb.WrongProcess, match="num_workers=0"):
            next(iter(as_torch(ds.train)))
        monkeypatch.undo()
        assert sum(len(b["t2m"]) for b in as_torch(ds.train)) > 0


DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory):
    """One small array per dtype, in a v2 and a v3 store written by zarr-python, with values
    that need every bit of their type (and a NaN in the float ones)."""
    zarr = pytest.importorskip("zarr")
    rng = np.random.default_rng(7)
    stores = []
    for fmt in (2, 3):
        root = tmp_path_factory.mktemp(f"dtypes-v{fmt}") / "s.zarr"
        g = zarr.open_group(root, mode="w", zarr_format=fmt)
        ref = {}
        for dt in DTYPES:
            d = np.dtype(dt)
            if d.kind == "b":
                v = rng.random((10, 3, 4)) > 0.5
            elif d.kind in "iu":
                info = np.iinfo(d)
                v = rng.integers(info.min, info.max, (10, 3, 4), dtype=d, endpoint=True)
            elif d.kind == "f":
                v = (np.clip(rng.standard_normal((10, 3, 4)), -4, 4) * (float(np.finfo(d).max) / 8)).astype(d)
                v[0, 0, 0] = np.nan
            else:
                v = (rng.standard_normal((10, 3, 4)) * 1e30
                     + 1j * rng.standard_normal((10, 3, 4))).astype(d)
            a = g.create_array(dt, shape=v.shape, chunks=(3, 2, 4), dtype=d, fill_value=0)
            a[...] = v
            ref[dt] = v
        stores.append((root, ref))
    return stores


@pytest.mark.parametrize("dt", DTYPES)
def test_every_dtype_reaches_numpy_torch_and_jax_bit_for_bit(every_dtype, dt):
    for root, ref in every_dtype:
        geoms = isb.open_geometries(root, [dt])
        with isb.InSituDataset(root, geometries={"x": geoms[dt]}, batch_size=4,
                               shuffle=False) as ds:
            batches = list(ds.all)
            got = np.concatenate([b.arrays["x"] for b in batches])
            assert got.dtype == ref[dt].dtype
            assert got.tobytes() == ref[dt].tobytes(), f"{root}: {dt} differs from zarr-python"
            b = batches[0]
            arr = b.arrays["x"]
            torch = pytest.importorskip("torch")
            t = to_torch(b)["x"]
            assert str(t.dtype) == f"torch.{dt}"
            assert t.data_ptr() == arr.__array_interface__["data"][0]
            jax = pytest.importorskip("jax")
            narrowed = jax.dtypes.canonicalize_dtype(arr.dtype) != arr.dtype
            if narrowed:
                # JAX without x64 would turn 2**40 into 0 and 1e300 into inf: an error instead.
                with pytest.raises(isb.Unsupported, match="jax_enable_x64"):
                    to_jax(b)
                with jax.enable_x64(True):
                    j = to_jax(b)["x"]
            else:
                j = to_jax(b)["x"]
            assert j.dtype == arr.dtype
            assert np.asarray(j).tobytes() == arr.tobytes()


def test_a_dataloader_that_pickles_its_dataset_is_told_to_use_num_workers_0(fixtures):
    import pickle
    import warnings

    torch = pytest.importorskip("torch")
    with isb.InSituDataset(fixtures[0] / "era5_v3.zarr", batch_size=4) as ds:
        for obj in (ds, ds.train, iter(ds.train), as_torch(ds.train)):
            with pytest.raises(TypeError, match="num_workers=0"):
                pickle.dumps(obj)
        # Workers started by `spawn` (or `forkserver`, Python 3.14's default) get the dataset
        # pickled: the error says what to do instead of naming a ctypes pointer.
        loader = torch.utils.data.DataLoader(as_torch(ds.train), batch_size=None, num_workers=1,
                                             multiprocessing_context="spawn")
        with warnings.catch_warnings(), pytest.raises(TypeError, match="num_workers=0"):
            warnings.simplefilter("ignore")  # torch's own note about unpicklable arguments
            next(iter(loader))


RANK_SCRIPT = r'''
import datetime, json, os, sys
import torch
import torch.distributed as dist
import insitubatch as isb
from insitubatch.frameworks import as_torch

store, out, even = sys.argv[1], sys.argv[2], sys.argv[3] == "even"
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
rank, world_size = dist.get_rank(), dist.get_world_size()
g = isb.open_geometries(store, ["raw", "mask"])
manifest = isb.split_by_chunk(g["mask"], (1.0,))
steps = 0
with isb.InSituDataset(store, manifest, g, batch_size=5, seed=7, rank=rank,
                       world_size=world_size, even_train=even) as ds:
    loader = torch.utils.data.DataLoader(as_torch(ds.train), batch_size=None, num_workers=0)
    for epoch in range(2):
        ds.set_epoch(epoch)
        for batch in loader:
            n = torch.tensor([batch["raw"].shape[0]])
            dist.all_reduce(n)  # a step every rank must take together, as DDP's gradient sync
            steps += 1
    ids = [i for b in ds.train for i in b.sample_indices.tolist()]
    loader_len = len(loader)
dist.barrier()
dist.destroy_process_group()
json.dump({"steps": steps, "ids": ids, "loader_len": loader_len}, open(out, "w"))
'''


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(fixtures, tmp_path, mode):
    import os
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(fixtures[0] / "paired.zarr"),
                          str(tmp_path / f"rank{r}.json"), mode],
                         env={**env, "RANK": str(r)}, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        errors.append((p.returncode, err))
    return errors


def test_ranks_under_torch_distributed_step_together_and_share_the_data(fixtures, tmp_path):
    # Two processes as torchrun starts them, an all-reduce per step as DDP's gradient sync: the
    # mask's grid has chunks of 30, 30 and 1 samples, so rank 0 holds 30 and rank 1 31.
    pytest.importorskip("torch")
    errors = _run_ranks(fixtures, tmp_path, "even")
    assert all(code == 0 for code, _ in errors), errors
    import json

    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["steps"] == r1["steps"] == 2 * 6, "30 samples each in batches of 5, two epochs"
    assert r0["loader_len"] == r1["loader_len"] == 6
    assert len(r0["ids"]) == len(r1["ids"]) == 30 and not set(r0["ids"]) & set(r1["ids"])
    # Without evening out the ranks take 7 and 6 steps per epoch: the rank with more waits in an
    # all-reduce its peer never joins (gloo gives up after the group's timeout).
    errors = _run_ranks(fixtures, tmp_path, "whole")
    assert any(code != 0 and ("timed out" in err.lower() or "connection" in err.lower())
               for code, err in errors), errors
