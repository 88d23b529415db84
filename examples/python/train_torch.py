"""Train a next-step forecaster with insitubatch feeding torch: shuffled epochs, validation,
a checkpoint to resume from mid-epoch, and torchrun's data-parallel ranks.

The model sees a field at time t (`x`) and predicts it at t + lead (`y`, the same array shifted:
insitubatch decodes each chunk once for both). Its last layer starts at zero, so before any step
it predicts persistence (y = x), and the validation line says how far training has moved it past
that baseline. Each epoch line also says how much of the step time went to waiting for data.

    insitubatch make-dataset /tmp/era5.zarr
    python examples/python/train_torch.py /tmp/era5.zarr --epochs 3
    python examples/python/train_torch.py /tmp/era5.zarr --checkpoint /tmp/fc.pt --stop-after 20
    python examples/python/train_torch.py /tmp/era5.zarr --checkpoint /tmp/fc.pt   # resumes
    torchrun --standalone --nproc-per-node 2 examples/python/train_torch.py /tmp/era5.zarr

A resumed run continues the same epoch at the batch after the checkpoint, sample for sample
(`as_torch(..., start_batch=k)`), without reading the chunks of the batches already done. With
`--cache-dir`, each rank keeps its decoded chunks on local disk for the next run.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F

import insitubatch as isb
from insitubatch.frameworks import as_torch


class Forecaster(torch.nn.Module):
    """x + a learned step, computed on each sample normalised by its own mean and spread."""

    def __init__(self, width: int = 16):
        super().__init__()

        # Circular padding wraps longitude (and, for brevity, latitude too).
        def conv(i, o):
            return torch.nn.Conv2d(i, o, 3, padding=1, padding_mode="circular")

        self.net = torch.nn.Sequential(conv(1, width), torch.nn.GELU(), conv(width, width),
                                       torch.nn.GELU(), conv(width, 1))
        torch.nn.init.zeros_(self.net[-1].weight)  # persistence to begin with
        torch.nn.init.zeros_(self.net[-1].bias)

    def forward(self, x):  # (batch, lat, lon)
        mean = x.mean(dim=(1, 2), keepdim=True)
        spread = x.std(dim=(1, 2), keepdim=True) + 1e-6
        return x + spread * self.net(((x - mean) / spread).unsqueeze(1)).squeeze(1)


def evaluate(model, view, world_size):
    """Validation MSE of the model and of persistence, over every rank's share of the split."""
    totals = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for t in as_torch(view):
            totals[0] += F.mse_loss(model(t["x"]), t["y"], reduction="sum").item()
            totals[1] += F.mse_loss(t["x"], t["y"], reduction="sum").item()
            totals[2] += t["y"].numel()
    if world_size > 1:
        torch.distributed.all_reduce(totals)
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--var", default="t2m")
    ap.add_argument("--lead", type=int, default=1, help="steps ahead to predict")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--checkpoint", help="saved after every epoch (and at --stop-after); "
                    "a run that finds it resumes from it")
    ap.add_argument("--stop-after", type=int, help="stop after this many steps, as if killed "
                    "(with --checkpoint: saved first)")
    ap.add_argument("--cache-dir", help="keep decoded chunks here across runs (one "
                    "subdirectory per rank)")
    a = ap.parse_args()

    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world_size == 1:
        return train(a, rank, world_size)
    torch.distributed.init_process_group("gloo")
    torch.set_num_threads(1)  # ranks share the node's cores with the loader's executors
    try:
        train(a, rank, world_size)
    finally:
        torch.distributed.destroy_process_group()


def train(a, rank, world_size):
    torch.manual_seed(0)

    g = isb.open_geometries(a.store, [a.var])[a.var]
    manifest = isb.split_by_chunk(g, (0.8, 0.2), seed=0)  # train, val: whole chunks, contiguous
    cache = {}
    if a.cache_dir:
        cache = dict(cache_dir=os.path.join(a.cache_dir, f"rank{rank}"), persist=True)
    model = Forecaster()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    start_epoch, start_batch = 0, 0
    if a.checkpoint and os.path.exists(a.checkpoint):
        saved = torch.load(a.checkpoint)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        start_epoch, start_batch = saved["epoch"], saved["batch"]
    plain = model  # what a checkpoint saves, without DDP's wrapper
    if world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)

    def save(epoch, batch):
        if a.checkpoint and rank == 0:
            torch.save({"model": plain.state_dict(), "opt": opt.state_dict(), "epoch": epoch,
                        "batch": batch}, a.checkpoint)

    views = {"x": g, "y": g.shift(a.lead)}
    with isb.InSituDataset(a.store, manifest, views, batch_size=a.batch_size, rank=rank,
                           world_size=world_size, **cache) as ds:
        say = print if rank == 0 else (lambda *_: None)
        say(f"train: {ds.train.n_samples} samples per epoch and rank in {len(ds.train)} batches, "
            f"{world_size} rank(s)")
        if start_epoch or start_batch:
            say(f"resumed at epoch {start_epoch}, batch {start_batch}")
        steps = 0
        for epoch in range(start_epoch, a.epochs):
            ds.set_epoch(epoch)
            first = start_batch if epoch == start_epoch else 0
            samples, loss_sum, wait, work = 0, 0.0, 0.0, 0.0
            t = time.perf_counter()
            for i, tensors in enumerate(as_torch(ds.train, start_batch=first), start=first):
                t1 = time.perf_counter()
                loss = F.mse_loss(model(tensors["x"]), tensors["y"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                samples += len(tensors["x"])
                loss_sum += loss.item() * len(tensors["x"])
                steps += 1
                now = time.perf_counter()
                wait, work, t = wait + (t1 - t), work + (now - t1), now
                if a.stop_after and steps == a.stop_after:
                    save(epoch, i + 1)
                    say(f"stopped after {steps} steps, at epoch {epoch}, batch {i + 1}")
                    return
            # The unwrapped model: ranks may hold different numbers of validation batches, and
            # DDP's forward can run a collective (buffer broadcasts) that all ranks must join.
            val, persistence = evaluate(plain, ds.val, world_size)
            save(epoch + 1, 0)
            say(f"epoch {epoch}: {samples} samples, train mse {loss_sum / max(samples, 1):.4f}, "
                f"val mse {val:.4f} against persistence {persistence:.4f} "
                f"(skill {1 - val / persistence:+.2f}); waited for data "
                f"{100 * wait / max(wait + work, 1e-9):.1f} % of the step time")


if __name__ == "__main__":
    main()
