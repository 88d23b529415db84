"""An indexed climatology as a channel of a stack: read by the library at each sample's day of
year (each of its chunks decoded once a pass), against the consumer's way without the feature:
the climatology preloaded in RAM with zarr-python and its day appended in a batch transform
(`np.concatenate`). Epochs with the default budget (the working set: every epoch reads and
decodes its chunks again) and resident ones (a budget holding the split), best of `--rounds`
alternated rounds, samples/s.

    python bench/indexed.py YEAR_STORE CLIM_STORE --variable t2m --clim t2m
"""

import argparse

import numpy as np
import zarr

import insitubatch as isb
from timing import epoch_rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("store")
    ap.add_argument("clim_store")
    ap.add_argument("--variable", default="t2m")
    ap.add_argument("--clim", default="t2m")
    ap.add_argument("--samples-per-day", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    x = isb.open_geometries(a.store)[a.variable]
    c = isb.open_geometries(a.clim_store)[a.clim]
    n = x.shape[x.sample_axis]
    day = (np.arange(n) // a.samples_per_day) % c.shape[0]
    mounts = {"clim": a.clim_store}
    results = {}
    for cold, budget in ((True, None), (False, 1 << 34)):
        library = isb.InSituDataset(a.store, None, {"x": x, "c": c}, mounts=mounts,
                                    indexes={"c": day}, stacks={"xc": ["x", "c"]},
                                    cache_budget_bytes=budget)
        held = np.asarray(zarr.open_array(f"{a.clim_store}/{a.clim}", mode="r")[...])

        def append_day(batch):
            xc = batch.arrays["xc"]
            batch.arrays["xc"] = np.concatenate([xc, held[day[batch.sample_indices]][:, None]], 1)
            return batch

        consumer = isb.InSituDataset(a.store, None, {"x": x}, stacks={"xc": ["x"]},
                                     cache_budget_bytes=budget, batch_transforms=[append_day])
        if not cold:
            for ds in (library, consumer):
                epoch_rate(ds)  # fill the pool
        best = {"library": 0.0, "consumer": 0.0}
        for _ in range(a.rounds):
            for name, ds in (("library", library), ("consumer", consumer)):
                best[name] = max(best[name], epoch_rate(ds))
        results["default" if cold else "resident"] = best
        library.close()
        consumer.close()
    for kind, best in results.items():
        for name, rate in best.items():
            print(f"{kind:>9} {name:>9}: {rate:8.0f} samples/s "
                  f"({rate / best['consumer']:.2f} of the consumer's)")


if __name__ == "__main__":
    main()
