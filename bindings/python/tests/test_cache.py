"""The NVMe tier through Python: numpy opens slot files, a warm run decodes nothing, the lock,
readonly readers and their misses, stale caches, and warnings as Python warnings."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

import insitubatch as isb


def era5(fixtures):
    out, _ = fixtures
    return out / "era5_v3.zarr"


def log_entries(cache):
    lines = (cache / "insitu_cache.jsonl").read_text().splitlines()
    return [json.loads(l) for l in lines[1:]]


def drain(view):
    return [i for b in view for i in b.sample_indices.tolist()]


def test_numpy_loads_every_slot_file_and_it_equals_the_chunk(fixtures, tmp_path):
    store = era5(fixtures)
    cache = tmp_path / "cache"
    with isb.InSituDataset(store, batch_size=5, cache_dir=cache, persist=True) as ds:
        assert sorted(drain(ds.train)) == list(range(12))
        stats = ds.cache_stats()
        assert stats["writes"] == 9 and stats["write_errors"] == 0  # t2m, u10, station x 3
    entries = log_entries(cache)
    assert len(entries) == 9
    for e in entries:
        ref = zarr.open_array(store / e["array"], mode="r")
        spc = ref.chunks[0]
        a = np.load(cache / e["file"], mmap_mode="r")
        assert a.shape == tuple(e["shape"]) and a.dtype == np.dtype(e["dtype"])
        c = e["chunk"]
        np.testing.assert_array_equal(a, ref[c * spc:(c + 1) * spc])


def test_an_ephemeral_spill_stays_within_its_budget_and_goes_on_close(fixtures, tmp_path):
    # t2m: 12 samples in 3 chunks of 4 (2,304-byte slots); a budget of two slots, so every
    # epoch evicts, and each decoded slot is written or, evicted before its turn, skipped.
    store = era5(fixtures)
    cache = tmp_path / "spill"
    ref = zarr.open_array(store / "t2m", mode="r")[...]
    slot = ref[:4].nbytes
    g = isb.open_geometries(store, ["t2m"])
    decoded = 0
    with isb.InSituDataset(store, None, g, batch_size=2, block_chunks=1, cache_dir=cache,
                           cache_budget_bytes=2 * slot) as ds:
        for epoch in range(3):
            ds.set_epoch(epoch)
            seen = []
            for b in ds.train:
                for r, idx in enumerate(b.read_indices("t2m")):
                    np.testing.assert_array_equal(b.arrays["t2m"][r], ref[idx])
                seen.extend(b.sample_indices.tolist())
                assert len(list(cache.glob("*.npy*"))) <= 2, "files over the budget"
            assert sorted(seen) == list(range(12))
            decoded += ds.cache_misses
        st = ds.cache_stats()
        assert st["persist"] is False and st["write_errors"] == 0
        assert st["writes"] > 0 and st["writes"] + st["writes_skipped"] == decoded, st
        assert not (cache / "insitu_cache.jsonl").exists(), "no log without persist"
    assert not list(cache.glob("*.npy*")), "files unlinked on close"


def test_a_warm_run_decodes_nothing_and_values_match(fixtures, tmp_path):
    store = era5(fixtures)
    cache = tmp_path / "cache"
    ref = zarr.open_array(store / "t2m", mode="r")[...]
    g = isb.open_geometries(store, ["t2m"])
    with isb.InSituDataset(store, None, g, batch_size=4, cache_dir=cache, persist=True,
                           cache_direct_io=False) as ds:
        drain(ds.train)
        assert ds.cache_misses == 3
        assert ds.cache_stats()["direct_io"] is False
    with pytest.raises(TypeError, match="cache_direct_io"):
        isb.InSituDataset(store, cache_dir=cache, cache_direct_io="yes")
    with isb.InSituDataset(store, None, g, batch_size=4, cache_dir=cache, persist=True) as ds:
        for b in ds.train:
            for r, idx in enumerate(b.read_indices("t2m")):
                np.testing.assert_array_equal(b.arrays["t2m"][r], ref[idx])
        s = ds.stats()
        assert (s["tiles_read"], s["bytes_decoded"], ds.cache_revived) == (0, 0, 3)


def test_lock_readonly_and_readonly_miss(fixtures, tmp_path):
    store = era5(fixtures)
    cache = tmp_path / "cache"
    g = isb.open_geometries(store, ["t2m"])
    writer = isb.InSituDataset(store, None, g, cache_dir=cache, persist=True)
    with pytest.raises(isb.CacheLocked, match=f"another dataset in this process \\(pid {os.getpid()}"):
        isb.InSituDataset(store, None, g, cache_dir=cache, persist=True)
    drain(writer.all)
    writer.close()
    readers = [isb.InSituDataset(store, None, g, cache_dir=cache, readonly_cache=True) for _ in range(2)]
    for r in readers:
        assert sorted(drain(r.train)) == list(range(12))
        assert r.stats()["tiles_read"] == 0
    with pytest.raises(isb.CacheLocked, match="readonly_cache readers"):
        isb.InSituDataset(store, None, g, cache_dir=cache, persist=True)
    for r in readers:
        r.close()
    # u10 was never warmed: a readonly reader's miss is an error naming the chunk.
    with isb.InSituDataset(store, None, isb.open_geometries(store, ["u10"]), cache_dir=cache,
                           readonly_cache=True) as ds:
        with pytest.raises(isb.CacheMiss, match=r"u10\[chunk 0\]"):
            drain(ds.all)


def test_stale_cache_raises_and_reset_rebuilds(fixtures, tmp_path):
    store = era5(fixtures)
    cache = tmp_path / "cache"
    g = isb.open_geometries(store, ["t2m", "u10"])
    with isb.InSituDataset(store, None, g, cache_dir=cache, persist=True) as ds:
        drain(ds.all)
    log = cache / "insitu_cache.jsonl"
    lines = log.read_text().splitlines()
    edited = [lines[0]]
    for line in lines[1:]:
        e = json.loads(line)
        if e["array"] == "u10":
            e["fingerprint"] = "ffffffffffffffff"
        edited.append(json.dumps(e))
    log.write_text("\n".join(edited) + "\n")
    with pytest.raises(isb.StaleCache, match=r"\[u10\]"):
        isb.InSituDataset(store, None, g, cache_dir=cache, persist=True)
    with isb.InSituDataset(store, None, g, cache_dir=cache, persist=True, reset_stale_cache=True) as ds:
        drain(ds.all)
        assert (ds.cache_revived, ds.cache_misses) == (3, 3)


def test_a_cache_that_serves_nothing_warns(fixtures, tmp_path):
    store = era5(fixtures)
    cache = tmp_path / "cache"
    g = isb.open_geometries(store, ["t2m"])
    with isb.InSituDataset(store, None, g, cache_dir=cache, persist=True) as ds:
        drain(ds.all)
    for f in cache.glob("*.npy"):
        f.unlink()
    with isb.InSituDataset(store, None, g, cache_dir=cache, persist=True) as ds:
        with pytest.warns(isb.CacheWarning, match="served 0 hits"):
            drain(ds.all)


def test_sigkilled_warm_keeps_finished_chunks(fixtures, tmp_path):
    out, _ = fixtures
    store = out / "paired.zarr"
    cache = tmp_path / "cache"
    child = r"""
import sys, time, insitubatch as isb
g = isb.open_geometries(sys.argv[1], ["raw"])
with isb.InSituDataset(sys.argv[1], None, g, batch_size=1, block_chunks=1, max_inflight=1,
                       prefetch_depth=1, cache_dir=sys.argv[2], persist=True) as ds:
    for b in ds.train:
        time.sleep(0.04)
"""
    p = subprocess.Popen([sys.executable, "-c", child, str(store), str(cache)], env=os.environ.copy())
    deadline = time.monotonic() + 60
    log = cache / "insitu_cache.jsonl"
    while not log.exists() or len(log.read_text().splitlines()) < 9:
        assert time.monotonic() < deadline and p.poll() is None, "child did not log 8 chunks"
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    logged = len(log_entries(cache))
    ref = zarr.open_array(store / "raw", mode="r")[...]
    g = isb.open_geometries(store, ["raw"])
    with isb.InSituDataset(store, None, g, batch_size=4, cache_dir=cache, persist=True) as ds:
        for b in ds.all:
            for r, idx in enumerate(b.read_indices("raw")):
                np.testing.assert_array_equal(b.arrays["raw"][r], ref[idx])
        assert (ds.cache_revived, ds.cache_misses) == (logged, 61 - logged)


def test_a_writer_in_another_process_is_named_as_such(fixtures, tmp_path):
    store = era5(fixtures)
    cache = tmp_path / "cache"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, insitubatch as isb\n"
         f"ds = isb.InSituDataset({str(store)!r}, cache_dir={str(cache)!r}, persist=True)\n"
         "print('ready', flush=True)\n"
         "sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(isb.CacheLocked, match=rf"another process \(pid {holder.pid} on host"):
            isb.InSituDataset(store, cache_dir=cache, persist=True)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    # Once it has exited, the lock is free (the kernel released it).
    with isb.InSituDataset(store, cache_dir=cache, persist=True):
        pass
