"""One engine, one store, in this process; prints one JSON object. Run by run.py, which samples
the whole process tree's memory from outside.

    python engines.py ENGINE STORE [--epochs E] [--batch-size B] [--workers W] [--sequential]

--sequential: every sample in store order, as an inference pass reads them (insitubatch's `all`
view, a DataLoader without shuffling); for the loaders only.

ENGINE: insitubatch-python | torch-dataloader | xbatcher | zarr-sequential | in-memory | raw-read
"""

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

T_PROCESS = float(os.environ.get("HARNESS_T0", time.time()))


def data_variables(store):
    """The group's data variables, by the same rule as insitubatch: skip 0-D arrays and
    coordinates (a 1-D array whose one dimension is named after itself, from v3
    `dimension_names` or v2 `_ARRAY_DIMENSIONS`)."""
    import zarr

    g = zarr.open_group(store, mode="r")
    out = {}
    for name, a in g.arrays():
        dims = getattr(a.metadata, "dimension_names", None) or a.attrs.get("_ARRAY_DIMENSIONS")
        if a.ndim == 0 or (a.ndim == 1 and dims and dims[0] == name):
            continue
        out[name] = a
    return out


class PerSample:
    """The classic map-style dataset: one sample per __getitem__, read with zarr-python. Module
    level so DataLoader workers started by forkserver can unpickle it."""

    def __init__(self, store, names, n):
        self.store, self.names, self.n = store, names, n
        self.arrays = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        if self.arrays is None:  # opened in the worker, never inherited across a fork
            self.arrays = data_variables(self.store)
        return {k: torch.from_numpy(np.asarray(self.arrays[k][i])) for k in self.names}


class SampleTensors:
    """xbatcher MapDataset transform: one (1, *inner) xarray sample to one tensor
    (variables, *inner) — MapDataset requires a single tensor."""

    def __init__(self, names):
        self.names = names

    def __call__(self, x):
        import torch

        return torch.from_numpy(np.stack([np.asarray(x[k].values[0]) for k in self.names]))


def latency_summary(intervals_s):
    """p50/p90/p99/max of the batch intervals from an HdrHistogram (microseconds, 3 significant
    digits, as the Rust engine records them), so every engine's percentiles are computed alike."""
    if not intervals_s:
        return {}
    from hdrh.histogram import HdrHistogram

    h = HdrHistogram(1, 3_600_000_000, 3)  # 1 µs .. 1 h
    for s in intervals_s:
        h.record_value(max(1, int(round(s * 1e6))))
    return {
        "latency_ms_p50": h.get_value_at_percentile(50) / 1e3,
        "latency_ms_p90": h.get_value_at_percentile(90) / 1e3,
        "latency_ms_p99": h.get_value_at_percentile(99) / 1e3,
        "latency_ms_max": h.get_max_value() / 1e3,
    }


def make_train_step(names, accelerator_ms=0.0):
    """A small torch model step per batch (the "keeping the accelerator fed" mode; on a CPU-only
    machine it runs on the CPU): a linear layer over the first 4096 values of each sample. With
    `accelerator_ms`, the step then waits that long, as a host waits for a GPU's step, the
    cores left to the loader: an accelerator that takes a batch every `accelerator_ms`."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4096, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-9)

    def step(batch):
        x = torch.as_tensor(np.asarray(batch[names[0]])).reshape(len(batch[names[0]]), -1)
        x = torch.nn.functional.pad(x[:, :4096], (0, max(0, 4096 - x.shape[1])))
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if accelerator_ms:
            time.sleep(accelerator_ms / 1e3)

    return step


def timed_epochs(make_iter, epochs, sample_bytes, step=None):
    """Runs `epochs` epochs of `make_iter(epoch)`, which yields (rows, batch dict); with `step`,
    runs it on every batch and reports the fraction of wall time spent waiting for data."""
    out = []
    for e in range(epochs):
        t0 = time.perf_counter()
        last = t0
        intervals, n, ttfb, step_s = [], 0, None, 0.0
        for batch_len, batch in make_iter(e):
            now = time.perf_counter()
            if ttfb is None:
                ttfb = now - t0
                ttfb_process = time.time() - T_PROCESS
            intervals.append(now - last)
            if step is not None:
                s0 = time.perf_counter()
                step(batch)
                step_s += time.perf_counter() - s0
            last = time.perf_counter()
            n += batch_len
        secs = time.perf_counter() - t0
        row = {
            "epoch": e,
            "samples": n,
            "seconds": secs,
            "samples_per_s": n / secs,
            "mb_per_s": n * sample_bytes / secs / 1e6,
            "ttfb_ms": ttfb * 1e3,
            "ttfb_from_process_start_ms": ttfb_process * 1e3 if e == 0 else None,
            **latency_summary(intervals),
            "intervals_ms": [round(x * 1e3, 4) for x in intervals],
        }
        if step is not None:
            row["step_s"] = step_s
            row["data_stall_fraction"] = 1.0 - step_s / secs
        out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("store")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--train-step", action="store_true", help="run a small torch model step per batch")
    ap.add_argument("--accelerator-ms", type=float, default=0.0,
                    help="with --train-step, wait this long in each step, as for a GPU's step")
    ap.add_argument("--sequential", action="store_true",
                    help="store order, as an inference pass (insitubatch and the DataLoader)")
    ap.add_argument("--prefetch-next-epoch", action="store_true",
                    help="insitubatch-python: start each next epoch while the last one ends")
    a = ap.parse_args()
    if a.sequential and a.engine not in ("insitubatch-python", "torch-dataloader"):
        sys.exit(f"--sequential is for insitubatch-python and torch-dataloader, not {a.engine!r}")
    if a.prefetch_next_epoch and a.engine != "insitubatch-python":
        sys.exit(f"--prefetch-next-epoch is for insitubatch-python, not {a.engine!r}")
    store = Path(a.store)
    bs = a.batch_size
    extra = {}
    if a.engine == "insitubatch-python":
        # The shim needs no zarr-python: the store's variables come from the dataset, so the
        # time to first batch from process start is what a user of the shim pays.
        import insitubatch as isb

        ds = isb.InSituDataset(store, batch_size=bs, shuffle=not a.sequential,
                               prefetch_next_epoch=a.prefetch_next_epoch)
        formats = ds.sample_formats
        names = sorted(formats)
        sample_bytes = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in formats.values())
        spc = ds.geometries[names[0]].samples_per_chunk
    else:
        arrays = data_variables(store)
        names = sorted(arrays)
        n = arrays[names[0]].shape[0]
        sample_bytes = sum(int(np.prod(arrays[k].shape[1:])) * arrays[k].dtype.itemsize for k in names)
        spc = int(arrays[names[0]].chunks[0])
    if a.accelerator_ms and not a.train_step:
        sys.exit("--accelerator-ms needs --train-step")
    step = make_train_step(names, a.accelerator_ms) if a.train_step else None

    def shuffled(epoch):
        return np.random.default_rng(epoch).permutation(n)

    if a.engine == "insitubatch-python":
        view = ds.all if a.sequential else ds.train
        started_ahead = []

        def make_iter(e):
            ds.set_epoch(e)
            for b in view:
                yield len(b), b.arrays
            started_ahead.append(bool(ds.stats()["started_ahead"]))

        epochs = timed_epochs(make_iter, a.epochs, sample_bytes, step)
        for row, ahead in zip(epochs, started_ahead):
            row["started_ahead"] = ahead
        ds.close()
    elif a.engine == "torch-dataloader":
        import torch
        from torch.utils.data import DataLoader

        # forkserver: zarr-python runs an asyncio loop thread, which fork would copy dead.
        # Persistent workers: the baseline pays worker start-up once, not every epoch.
        ctx = "forkserver" if a.workers > 0 else None
        extra = {"workers": a.workers, "start_method": ctx or "in-process"}
        gen = torch.Generator()
        dl = DataLoader(PerSample(str(store), names, n), batch_size=bs, shuffle=not a.sequential,
                        num_workers=a.workers, multiprocessing_context=ctx,
                        persistent_workers=a.workers > 0, generator=gen)

        def make_iter(e):
            gen.manual_seed(e)
            for b in dl:
                yield len(b[names[0]]), b

        epochs = timed_epochs(make_iter, a.epochs, sample_bytes, step)
    elif a.engine == "xbatcher":
        # xbatcher's BatchGenerator over xarray.open_zarr (dask), one sample per item, through
        # its torch MapDataset and a shuffling DataLoader: the xarray-native way to train.
        import torch
        import xarray as xr
        import xbatcher
        from torch.utils.data import DataLoader
        from xbatcher.loaders.torch import MapDataset

        xds = xr.open_zarr(store, consolidated=False)[names]
        dims = xds[names[0]].dims
        sample = {d: xds.sizes[d] for d in dims} | {dims[0]: 1}
        samples = xbatcher.BatchGenerator(xds, input_dims=sample)
        extra = {"workers": a.workers, "start_method": "in-process"}
        gen = torch.Generator()
        dl = DataLoader(MapDataset(samples, transform=SampleTensors(names)), batch_size=bs,
                        shuffle=True, num_workers=0, generator=gen)

        def make_iter(e):
            gen.manual_seed(e)
            for b in dl:
                yield len(b), {k: b[:, i] for i, k in enumerate(names)}

        epochs = timed_epochs(make_iter, a.epochs, sample_bytes, step)
    elif a.engine == "zarr-sequential":
        def make_iter(e):
            order = shuffled(e)
            for s in range(0, n, bs):
                idx = order[s:s + bs]
                b = {k: np.stack([arrays[k][int(i)] for i in idx]) for k in names}
                yield len(idx), b

        epochs = timed_epochs(make_iter, a.epochs, sample_bytes, step)
    elif a.engine == "in-memory":
        ram = {k: arrays[k][...] for k in names}  # preloaded, untimed

        def make_iter(e):
            order = shuffled(e)
            for s in range(0, n, bs):
                idx = order[s:s + bs]
                b = {k: ram[k][idx] for k in names}
                yield len(idx), b

        epochs = timed_epochs(make_iter, a.epochs, sample_bytes, step)
    elif a.engine == "raw-read":
        files = [p for k in names for p in (store / k).rglob("*") if p.is_file() and p.name != "zarr.json"]

        def make_iter(e):
            per = max(1, len(files) * bs // n)
            for s in range(0, len(files), per):
                for p in files[s:s + per]:
                    p.read_bytes()
                yield min(bs, n), None

        epochs = timed_epochs(make_iter, a.epochs, sample_bytes)  # no model step: no data
        for ep in epochs:  # bytes only: the samples column is the decoded size of the same chunks
            ep["samples"] = n
    else:
        sys.exit(f"unknown engine {a.engine!r}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({
        "engine": a.engine,
        "store": str(store),
        "samples_per_chunk": spc,
        "sample_bytes": sample_bytes,
        "epochs": epochs,
        "cpu_s": usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime,
        **extra,
    }))


if __name__ == "__main__":
    main()
