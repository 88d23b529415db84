"""Random stores written by zarr-python (v2 and v3, sharded or not, any sample axis, chunks
never written, windows of either sign, splits) read through the Python shim: every row equals
zarr-python's value at its read index, and every valid anchor comes once per split."""

import os

import numpy as np
import pytest

import insitubatch as isb

zarr = pytest.importorskip("zarr")

# CI draws 40; `ISB_PY_RANDOM_CASES=n` draws the first n (a longer soak).
CASES = int(os.environ.get("ISB_PY_RANDOM_CASES", "40"))


def _draw(seed, tmp_path):
    rng = np.random.default_rng(seed)
    fmt = int(rng.choice([2, 3]))
    ndim = int(rng.integers(2, 5))
    axis = int(rng.integers(0, ndim))
    n = int(rng.integers(1, 30))
    shape = tuple(n if a == axis else int(rng.integers(1, 6)) for a in range(ndim))
    chunks = tuple(int(rng.integers(1, s + 2)) for s in shape)
    shards = None
    if fmt == 3 and rng.random() < 0.35:
        shards = tuple(c * int(rng.integers(1, 3)) for c in chunks)
    dtype = np.dtype(rng.choice(["uint8", "int16", "float32", "float64", "int64"]))
    root = tmp_path / "s.zarr"
    g = zarr.open_group(root, mode="w", zarr_format=fmt)
    kwargs = {} if rng.random() < 0.5 else {"compressors": None}
    a = g.create_array("a", shape=shape, chunks=chunks, shards=shards, dtype=dtype,
                       fill_value=7, **kwargs)
    ref = np.full(shape, 7, dtype=dtype)
    values = (np.arange(np.prod(shape)) * 3 + 1).reshape(shape).astype(dtype)
    # Write all of it, or a random box of it: the chunks outside are never written.
    if rng.random() < 0.3:
        box = tuple(slice(int(lo), int(lo) + int(rng.integers(1, s - lo + 1)))
                    for s in shape for lo in [rng.integers(0, s)])
    else:
        box = tuple(slice(0, s) for s in shape)
    a[box] = values[box]
    ref[box] = values[box]
    offsets = [0]
    if rng.random() < 0.5:
        offsets.append(int(rng.integers(-2, 3)))
    knobs = dict(batch_size=int(rng.integers(1, 9)), block_chunks=int(rng.integers(1, 4)),
                 shuffle=bool(rng.random() < 0.7), seed=int(rng.integers(0, 100)),
                 max_inflight=int(rng.integers(1, 6)), prefetch_depth=int(rng.integers(1, 3)))
    fractions = [(1.0,), (0.5, 0.5), (0.6, 0.2, 0.2)][int(rng.integers(0, 3))]
    # Drawn last, so the cases drawn before it was added are unchanged.
    knobs["fast_first_batch"] = bool(rng.random() < 0.5)
    knobs["prefetch_next_epoch"] = bool(rng.random() < 0.35)
    return root, axis, ref, offsets, knobs, fractions


@pytest.mark.parametrize("seed", range(CASES))
def test_a_random_store_reads_as_zarr_python_wrote_it(tmp_path, seed):
    root, axis, ref, offsets, knobs, fractions = _draw(seed, tmp_path)
    g0 = isb.open_geometries(root, ["a"], sample_axis=axis)["a"]
    views = {f"v{i}": g0.shift(k) for i, k in enumerate(offsets)}
    try:
        manifest = isb.split_by_chunk(g0, fractions=fractions, seed=seed)
    except isb.InvalidArgument:
        manifest = None  # too few chunks for every fraction to get one
    n = ref.shape[axis]
    spc = g0.samples_per_chunk
    with isb.InSituDataset(root, manifest, views, **knobs) as ds:
        splits = ds.manifest.splits
        wants = {}
        for split in ["train", "val", "test"]:
            chunks = splits.get(split, [])
            want = wants[split] = sorted(
                a for c in chunks for a in range(c * spc, min((c + 1) * spc, n))
                if all(0 <= a + k < n for k in offsets)
            )
            view = getattr(ds, split)
            if not want:
                with pytest.raises(isb.Error, match="empty"):
                    next(iter(view))
                continue
            got = []
            for batch in view:
                for label, k in zip(views, offsets):
                    arr = batch.arrays[label]
                    reads = batch.read_indices(label)
                    assert list(reads) == [s + k for s in batch.sample_indices]
                    expect = np.stack([np.take(ref, r, axis=axis) for r in reads])
                    np.testing.assert_array_equal(arr, expect, err_msg=f"{split} {label}")
                got.extend(batch.sample_indices)
            assert sorted(got) == want, split
            if split != "train" or not knobs["shuffle"]:
                assert got == want, "sequential splits keep their order"
        # With `prefetch_next_epoch`, train's epoch 1 may have been started while epoch 0 ran
        # (and kept through val and test, or dropped for them): either way it is epoch 1's
        # order, with the store's values.
        train = wants["train"]
        if knobs["prefetch_next_epoch"] and train:
            ds.set_epoch(1)
            planned = ds.order("train").sample_indices.tolist()
            got = []
            for batch in ds.train:
                for label, k in zip(views, offsets):
                    reads = batch.read_indices(label)
                    expect = np.stack([np.take(ref, r, axis=axis) for r in reads])
                    np.testing.assert_array_equal(batch.arrays[label], expect, err_msg=label)
                got.extend(batch.sample_indices)
            assert got == planned and sorted(got) == train
