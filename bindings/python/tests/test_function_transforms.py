"""Python functions as chunk transforms (`transforms.Function`, the slow path): values equal
numpy's, once per chunk, beside built-ins in list order; a new shape and dtype; what a function
is shown; its exception ends the epoch naming it, the array and the chunk, and never hangs; a
persisted cache needs and keys on `identity`; the interpreter exits cleanly with a function
mid-epoch; library threads keep one thread state each and free it; epochs abandoned, failed and
closed in any order leave nothing behind; `preview` of one chunk."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

import insitubatch as isb
from insitubatch.transforms import Affine, ChunkInfo, Clip, Function, applies


def store_of(fixtures, name):
    out, _ = fixtures
    return out / name


def rows(ds, label, view="all"):
    """Every row of one epoch, by read index."""
    out = {}
    for b in getattr(ds, view):
        for r, idx in enumerate(b.read_indices(label)):
            out[int(idx)] = b.arrays[label][r].copy()
    return out


def test_a_function_runs_once_per_chunk_between_built_ins_and_equals_numpy(fixtures):
    store = store_of(fixtures, "era5_v3.zarr")
    t2m = zarr.open_array(store / "t2m", mode="r")[...]
    u10 = zarr.open_array(store / "u10", mode="r")[...]
    calls = []

    def squash(x):
        calls.append(threading.get_ident())
        # In place, as a function may: the chunk's own memory is the output.
        np.tanh(np.divide(x, np.float32(10), out=x), out=x)
        return x

    with isb.InSituDataset(
        store, None, isb.open_geometries(store, ["t2m", "u10"]), batch_size=5, shuffle=False,
        chunk_transforms=[
            Affine(offset=-273.15),
            applies("t2m", Function(squash, identity="squash v1")),
            Clip(-0.5, 0.5),
        ],
    ) as ds:
        got_t, got_u = rows(ds, "t2m"), rows(ds, "u10")
    # Affine on both, the function on t2m only, then the clip: in the list's order.
    want_t = np.clip(np.tanh((t2m + np.float32(-273.15)) / np.float32(10)), np.float32(-0.5),
                     np.float32(0.5))
    want_u = np.clip(u10 + np.float32(-273.15), np.float32(-0.5), np.float32(0.5))
    assert sorted(got_t) == list(range(12))
    for i in range(12):
        np.testing.assert_array_equal(got_t[i], want_t[i], err_msg=f"t2m sample {i}")
        np.testing.assert_array_equal(got_u[i], want_u[i], err_msg=f"u10 sample {i}")
    assert got_t[0].dtype == np.float32
    # Three chunks of t2m, each once, on the library's threads rather than this one.
    assert len(calls) == 3
    assert threading.get_ident() not in calls


def test_a_function_may_change_shape_and_dtype_and_is_told_where_the_chunk_is(fixtures):
    store = store_of(fixtures, "era5_v3.zarr")
    t2m = zarr.open_array(store / "t2m", mode="r")[...]
    seen = []

    def zonal_mean(x, info):
        seen.append((info, x.shape, x.dtype))
        return x.mean(axis=2, dtype=np.float64)

    with isb.InSituDataset(
        store, None, isb.open_geometries(store, ["t2m"]), batch_size=4, shuffle=False,
        chunk_transforms=[Function(zonal_mean, shape=(9,), dtype="float64", with_info=True)],
    ) as ds:
        assert ds.sample_formats["t2m"] == ((9,), np.dtype("float64"))
        got = rows(ds, "t2m")
    want = t2m.mean(axis=2, dtype=np.float64)
    for i in range(12):
        assert got[i].dtype == np.float64 and got[i].shape == (9,)
        np.testing.assert_array_equal(got[i], want[i], err_msg=f"sample {i}")
    assert sorted((s[0].index, s[0].first_sample) for s in seen) == [(0, 0), (1, 4), (2, 8)]
    assert {(s[0].array, s[1], s[2]) for s in seen} == {("t2m", (4, 9, 16), np.dtype("float32"))}
    assert isinstance(seen[0][0], ChunkInfo)


@pytest.mark.parametrize(
    "fn, needle",
    [
        (lambda x: 1 / 0, "ZeroDivisionError: division by zero"),
        (lambda x: x[:, :3], "returned shape (4, 3, 16) for a chunk whose output is (4, 9, 16)"),
        (lambda x: x.astype(np.complex64), "Cannot cast"),
    ],
    ids=["raises", "wrong-shape", "unsafe-cast"],
)
def test_a_failing_function_ends_the_epoch_naming_it_the_array_and_the_chunk(fixtures, fn, needle):
    store = store_of(fixtures, "era5_v3.zarr")
    with isb.InSituDataset(
        store, None, isb.open_geometries(store, ["t2m"]), batch_size=4, shuffle=False,
        chunk_transforms=[Function(fn)],
    ) as ds:
        with pytest.raises(isb.TransformError) as e:
            for _ in ds.all:
                pass
        msg = str(e.value)
        assert needle in msg and "array `t2m`" in msg and "Python function" in msg, msg
        # The dataset stays usable: a later epoch fails the same way, without hanging.
        with pytest.raises(isb.TransformError):
            for _ in ds.all:
                pass


def test_bad_function_declarations_are_refused_before_anything_runs(fixtures, tmp_path):
    store = store_of(fixtures, "era5_v3.zarr")
    g = isb.open_geometries(store, ["t2m"])
    with pytest.raises(TypeError, match="wrap it as insitubatch.transforms.Function"):
        isb.InSituDataset(store, None, g, chunk_transforms=[lambda x: x])
    with pytest.raises(TypeError, match="not callable"):
        Function(3)
    with pytest.raises(ValueError, match="identity"):
        Function(abs, identity=" ")
    with pytest.raises(ValueError, match="positive"):
        Function(abs, shape=(0, 3))
    with pytest.raises(isb.InvalidArgument, match="identity"):
        isb.InSituDataset(store, None, g, cache_dir=tmp_path, persist=True,
                          chunk_transforms=[Function(abs)])
    with pytest.raises(isb.InvalidArgument, match="t3m"):
        isb.InSituDataset(store, None, g, chunk_transforms=[applies("t3m", Function(abs))])


def test_a_persisted_cache_keys_on_the_functions_identity(fixtures, tmp_path):
    store = store_of(fixtures, "era5_v3.zarr")
    t2m = zarr.open_array(store / "t2m", mode="r")[...]
    g = isb.open_geometries(store, ["t2m"])
    calls = []

    def double(x):
        calls.append(1)
        return x * np.float32(2)

    def open_(identity, **kw):
        return isb.InSituDataset(store, None, g, batch_size=4, shuffle=False, cache_dir=tmp_path,
                                 persist=True, **kw,
                                 chunk_transforms=[Function(double, identity=identity)])

    with open_("double v1") as ds:
        got = rows(ds, "t2m")
    assert len(calls) == 3
    for i in range(12):
        np.testing.assert_array_equal(got[i], t2m[i] * np.float32(2))
    # A new run revives the function's output: no decode, no call.
    with open_("double v1") as ds:
        got = rows(ds, "t2m")
        assert ds.stats()["bytes_decoded"] == 0 and ds.cache_revived == 3
    assert len(calls) == 3
    np.testing.assert_array_equal(got[5], t2m[5] * np.float32(2))
    # Another identity is another function: the cache is stale until reset.
    with pytest.raises(isb.StaleCache, match="t2m"):
        open_("double v2")
    with open_("double v2", reset_stale_cache=True) as ds:
        rows(ds, "t2m")
    assert len(calls) == 6


def test_the_interpreter_exits_cleanly_with_a_function_mid_epoch(fixtures, tmp_path):
    # A slow function on the library's threads while the main thread leaves: the exit must
    # neither hang nor crash (no Python may run once the interpreter is being torn down).
    store = store_of(fixtures, "era5_v3.zarr")
    script = tmp_path / "leave.py"
    script.write_text(textwrap.dedent(f"""
        import time
        import numpy as np
        import insitubatch as isb
        from insitubatch.transforms import Function

        def slow(x):
            time.sleep(0.2)
            return x

        ds = isb.InSituDataset({str(store)!r}, batch_size=1, block_chunks=1, max_inflight=2,
                               chunk_transforms=[Function(slow)])
        it = iter(ds.all)
        next(it)
        print("left mid-epoch", flush=True)
    """))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(isb.__file__).resolve().parents[1])
    # Without the library's shutdown at exit, about one run in three aborted ("exception not
    # rethrown": a library thread entering Python during finalisation); four runs catch it
    # three times in four.
    for _ in range(4):
        out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "left mid-epoch" in out.stdout
        assert "Traceback" not in out.stderr, out.stderr



def test_a_dataset_collected_inside_its_own_function_is_freed_without_a_hang(fixtures):
    # Garbage collection may run inside a function, on a library thread, and collect the very
    # dataset and epoch that function serves (an unreachable cycle, its pass still prefetching):
    # they are freed from that thread, which must neither hang nor crash, and the function is
    # released once the library is done with it.
    import gc
    import time

    from insitubatch import _callbacks

    store = store_of(fixtures, "paired.zarr")
    collections = []

    def collect(x):
        time.sleep(0.01)  # so that some of the pass's decodes come after the `del` below
        collections.append(gc.collect())
        return x

    gc.disable()
    try:
        before = set(_callbacks._live)
        ds = isb.InSituDataset(store, None, isb.open_geometries(store, ["raw"]), batch_size=1,
                               block_chunks=4, chunk_transforms=[Function(collect)])
        live = set(_callbacks._live) - before
        assert len(live) == 1
        epoch = iter(ds.all)
        next(epoch)
        ds.cycle, epoch.cycle = epoch, ds
        del ds, epoch
        deadline = time.monotonic() + 20
        while live & set(_callbacks._live) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        gc.enable()
    assert not live & set(_callbacks._live), "the function was never released"
    assert any(n > 0 for n in collections), "a collection inside the function freed the cycle"


def _thread_states() -> int:
    """Python thread states of this interpreter (Python's threads and the library's threads
    that keep one between calls)."""
    import ctypes

    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    n, ts = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while ts:
        n, ts = n + 1, api.PyThreadState_Next(ts)
    return n


def test_library_threads_keep_a_thread_state_between_calls_and_free_it_as_they_end(fixtures):
    # One per library thread that ran a function, kept across calls (making one per call cost
    # ~60 us here), and freed when the dataset's threads end: opening and closing datasets
    # leaks none.
    store = store_of(fixtures, "era5_v3.zarr")
    g = isb.open_geometries(store, ["t2m", "u10"])
    threads = []
    before = _thread_states()
    for _ in range(3):
        with isb.InSituDataset(store, None, g, batch_size=4, executor_threads=2,
                               chunk_transforms=[Function(lambda x: threads.append(
                                   threading.get_ident()) or x)]) as ds:
            rows(ds, "t2m")
            during = _thread_states()
            ran_on = len(set(threads))
            threads.clear()
            assert 1 <= ran_on <= 2
            assert during == before + ran_on, (before, during, ran_on)
    assert _thread_states() == before


def test_epochs_stopped_failed_and_closed_in_any_order_leave_nothing_behind(fixtures):
    # Functions that fail on some chunks, epochs abandoned at random points, datasets closed
    # with epochs still open: every call ends, every function is released, no thread state
    # stays, and nothing hangs.
    import random

    from insitubatch import _callbacks

    store = store_of(fixtures, "paired.zarr")
    g = isb.open_geometries(store, ["raw"])
    rng = random.Random(7)
    before_states, before_live = _thread_states(), set(_callbacks._live)
    outcomes = {"ended": 0, "failed": 0, "abandoned": 0}

    def sometimes_refuse(x, info):
        if info.index % 11 == 5:
            raise RuntimeError(f"refusing chunk {info.index}")
        return x

    for round_ in range(12):
        ds = isb.InSituDataset(store, None, g, batch_size=rng.choice([1, 3, 8]),
                               block_chunks=rng.choice([1, 4, 16]), seed=round_,
                               chunk_transforms=[Function(sometimes_refuse, with_info=True)])
        stop_after = rng.choice([0, 1, 5, None])
        epoch = iter(ds.train)
        try:
            for n, _ in enumerate(epoch):
                if stop_after is not None and n >= stop_after:
                    outcomes["abandoned"] += 1
                    break
            else:
                outcomes["ended"] += 1
        except isb.TransformError as e:
            assert "refusing chunk" in str(e) and "array `raw`" in str(e), str(e)
            outcomes["failed"] += 1
        if rng.random() < 0.5:
            epoch.close()
        ds.close()  # with the epoch maybe still open
        del epoch, ds
    assert outcomes["failed"] > 0 and outcomes["abandoned"] > 0, outcomes
    deadline = time.monotonic() + 20
    while set(_callbacks._live) - before_live and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not set(_callbacks._live) - before_live, "a function was never released"
    assert _thread_states() == before_states


def test_preview_shows_one_chunk_before_and_after_through_the_library(fixtures):
    from insitubatch.transforms import preview

    store = store_of(fixtures, "era5_v3.zarr")
    t2m = zarr.open_array(store / "t2m", mode="r")[...]
    p = preview(store, "t2m", [Affine(offset=-273.15)], chunk=2)
    assert (p.array, p.chunk, p.first_sample) == ("t2m", 2, 8)
    np.testing.assert_array_equal(p.before, t2m[8:12])
    np.testing.assert_array_equal(p.after, t2m[8:12] + np.float32(-273.15))
    # A function's declared format, on real data.
    p = preview(store, "t2m", [Function(lambda x: x.mean(axis=2), shape=(9,))], chunk=0)
    assert p.after.shape == (4, 9) and p.after.dtype == np.float32
    np.testing.assert_array_equal(p.after, t2m[0:4].mean(axis=2))
    with pytest.raises(isb.TransformError, match="returned shape"):
        preview(store, "t2m", [Function(lambda x: x.mean(axis=2))])
    with pytest.raises(isb.InvalidArgument, match="chunks 0 to 2"):
        preview(store, "t2m", [], chunk=3)


def test_a_function_that_iterates_a_dataset_gets_an_error_not_a_hang(fixtures, tmp_path):
    # From inside the decoder, an iteration of the function's own dataset would wait on the
    # threads the function holds. Run in a child so that a regression is a failure, not a hang.
    store = store_of(fixtures, "era5_v3.zarr")
    script = tmp_path / "nested.py"
    script.write_text(textwrap.dedent(f"""
        import insitubatch as isb
        from insitubatch.transforms import Function

        g = isb.open_geometries({str(store)!r}, ["t2m"])
        holder = {{}}

        def nested(x):
            next(iter(holder["ds"].val))
            return x

        m = isb.split_by_chunk(g["t2m"], [0.67, 0.33])
        with isb.InSituDataset({str(store)!r}, m, g, batch_size=2, cache_budget_bytes=10**8,
                               chunk_transforms=[Function(nested)]) as ds:
            holder["ds"] = ds
            try:
                for _ in ds.train:
                    pass
            except isb.TransformError as e:
                print("TransformError:", e)
    """))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(isb.__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "TransformError:" in out.stdout and "must not iterate a dataset" in out.stdout, out.stdout
