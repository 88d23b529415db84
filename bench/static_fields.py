"""A static field as a channel of a stack: written by the library into each row, against the
same stack built in a batch transform by the consumer (numpy: the sampled channels stacked by
the library, the static channel appended with `np.concatenate`). Resident epochs (a budget
holding the split), best of `--rounds` alternated rounds, samples/s.

    python bench/static_fields.py STORE --static orography --variables t2m,u10
"""

import argparse

import numpy as np

import insitubatch as isb
from timing import epoch_rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("--variables", default="t2m,u10")
    ap.add_argument("--static", default="orography")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args()
    names = a.variables.split(",")
    g = isb.open_geometries(a.store, names + [a.static])
    sampled = {n: g[n] for n in names}
    budget = 1 << 34
    native = isb.InSituDataset(a.store, None, {**sampled, "s": g[a.static].as_static()},
                               stacks={"x": names + ["s"]}, cache_budget_bytes=budget)
    field = None

    def append_static(batch):
        x = batch.arrays["x"]
        s = np.broadcast_to(field, (x.shape[0], 1) + field.shape)
        batch.arrays["x"] = np.concatenate([x, s], axis=1)
        return batch

    consumer = isb.InSituDataset(a.store, None, sampled, stacks={"x": names},
                                 cache_budget_bytes=budget, batch_transforms=[append_static])
    # The static field as the consumer would hold it: read once, through the library.
    probe = isb.InSituDataset(a.store, None, {**sampled, "s": g[a.static].as_static()},
                              batch_size=1)
    field = next(iter(probe.train)).arrays["s"][0].copy()
    probe.close()
    for ds in (native, consumer):
        epoch_rate(ds)  # fill the pool
    best = {"library": 0.0, "batch transform": 0.0}
    for _ in range(a.rounds):
        for name, ds in (("library", native), ("batch transform", consumer)):
            for _ in range(a.epochs):
                best[name] = max(best[name], epoch_rate(ds))
    for name, rate in best.items():
        print(f"{name:>16}: {rate:8.0f} samples/s  ({rate / best['library']:.2f} of the library's)")


if __name__ == "__main__":
    main()
