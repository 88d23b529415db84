"""A few seconds of threads opening, iterating, abandoning and closing datasets and epochs at
random, on both IO backends: every row delivered equals zarr-python's, a finished epoch holds
every sample once, closing from another thread ends the epoch with `Closed` or lets it finish,
nothing else is raised, and nothing hangs."""

import random
import threading
import time

import numpy as np
import pytest

import insitubatch as isb

zarr = pytest.importorskip("zarr")

SECONDS = 3.0


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("stress") / "s.zarr"
    g = zarr.open_group(root, mode="w", zarr_format=3)
    ref = {}
    for i, name in enumerate(("a", "b")):
        a = g.create_array(name, shape=(97, 6, 5), chunks=(4, 3, 5), dtype="float32")
        a[...] = np.arange(97 * 30, dtype="float32").reshape(97, 6, 5) + i * 1e6
        ref[name] = a[...]
    try:
        isb.InSituDataset(root, io_backend="uring").close()
        backends = ["uring", "threads"]
    except isb.Error:  # io_uring blocked on this machine
        backends = ["threads"]
    return root, ref, backends


def _open(store, r):
    root, _, backends = store
    return isb.InSituDataset(
        root, batch_size=r.randint(1, 16), block_chunks=r.randint(1, 4),
        max_inflight=r.randint(1, 8), prefetch_depth=r.randint(1, 3),
        shuffle=r.random() < 0.7, seed=r.randint(0, 9), executor_threads=r.randint(1, 2),
        io_backend=r.choice(backends))


def _check(batch, ref, seen):
    for label in ("a", "b"):
        np.testing.assert_array_equal(batch.arrays[label], ref[label][batch.sample_indices])
    seen.extend(batch.sample_indices.tolist())


def test_threads_open_iterate_abandon_and_close_at_random(store):
    ref = store[1]
    failures = []
    stop = time.monotonic() + SECONDS

    def worker(seed):
        r = random.Random(seed)
        try:
            while time.monotonic() < stop:
                ds = _open(store, r)
                for epoch in range(r.randint(1, 3)):
                    ds.set_epoch(epoch)
                    seen = []
                    it = iter(ds.all if r.random() < 0.5 else ds.train)
                    quit_at = r.randint(0, 30)
                    for i, b in enumerate(it):
                        _check(b, ref, seen)
                        if i == quit_at:
                            it.close()
                            break
                    else:
                        assert sorted(seen) == list(range(97)), "a finished epoch is whole"
                if r.random() < 0.5:
                    ds.close()
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(repr(e))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a worker hung"
    assert not failures, failures[:3]


def test_closing_from_another_thread_ends_the_epoch_cleanly(store):
    ref = store[1]
    r = random.Random(7)
    outcomes = set()
    stop = time.monotonic() + SECONDS
    while time.monotonic() < stop:
        ds = _open(store, r)
        it = iter(ds.train)
        result = []

        def consume():
            seen = []
            try:
                for b in it:
                    _check(b, ref, seen)
                result.append("finished" if sorted(seen) == list(range(97)) else "cut short")
            except isb.Closed:
                result.append("Closed")
            except BaseException as e:  # noqa: BLE001 - reported below
                result.append(repr(e))

        consumer = threading.Thread(target=consume)
        consumer.start()
        time.sleep(r.random() * 0.01)
        (it.close if r.random() < 0.5 else ds.close)()
        consumer.join(20)
        assert not consumer.is_alive(), "the consumer hung"
        assert result and result[0] in ("finished", "cut short", "Closed"), result
        outcomes.add(result[0])
        ds.close()
    assert "finished" in outcomes or "Closed" in outcomes
