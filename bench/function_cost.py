"""What a Python function as a chunk transform (`transforms.Function`, the slow path) costs,
against the same arithmetic as a built-in and against no transform, through the Python shim.

Each configuration runs in its own fresh process, in interleaved rounds; each process runs six
cold epochs of `train` (the default budget is the working set, so every epoch decodes and
transforms nearly every chunk) and reports the median samples/s of epochs 1-5 and the CPU
seconds of the process. The function is ``x * float32(1) + float32(-273.15)`` in numpy, the same
values as ``Affine(offset=-273.15)``: written with temporaries ("function") and in place
("in_place"); "identity" returns its input (the cost of the call alone). Prints each run, then
the medians and their ratios.

    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \\
        python bench/function_cost.py STORE [ROUNDS]
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time

CONFIGS = ("none", "builtin", "function", "in_place", "identity")


def run(store: str, config: str) -> dict:
    import numpy as np

    import insitubatch as isb
    from insitubatch.transforms import Affine, Function

    def kelvin_to_celsius(x):
        return x * np.float32(1) + np.float32(-273.15)

    def kelvin_to_celsius_in_place(x):
        np.multiply(x, np.float32(1), out=x)
        np.add(x, np.float32(-273.15), out=x)
        return x

    transforms = {
        "none": [],
        "builtin": [Affine(offset=-273.15)],
        "function": [Function(kelvin_to_celsius, identity="k_to_c v1")],
        "in_place": [Function(kelvin_to_celsius_in_place, identity="k_to_c v1")],
        "identity": [Function(lambda x: x, identity="identity")],
    }[config]
    rates = []
    with isb.InSituDataset(store, chunk_transforms=transforms) as ds:
        for epoch in range(6):
            ds.set_epoch(epoch)
            t = time.perf_counter()
            n = sum(len(b) for b in ds.train)
            rates.append(n / (time.perf_counter() - t))
        misses = ds.stats()["cache_misses"]
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"config": config, "samples_s": statistics.median(rates[1:]),
            "cpu_s": ru.ru_utime + ru.ru_stime, "last_epoch_misses": misses}


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--one":
        print(json.dumps(run(sys.argv[2], sys.argv[3])))
        return
    store = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    results = {c: [] for c in CONFIGS}
    for _ in range(rounds):
        for config in CONFIGS:
            out = subprocess.run([sys.executable, __file__, "--one", store, config], check=True,
                                 capture_output=True, text=True, env=os.environ).stdout
            r = json.loads(out)
            print(json.dumps(r), flush=True)
            results[config].append(r)
    base = statistics.median(r["samples_s"] for r in results["none"])
    for config in CONFIGS:
        rate = statistics.median(r["samples_s"] for r in results[config])
        cpu = statistics.median(r["cpu_s"] for r in results[config])
        print(f"{config:>8}: {rate:8.0f} samples/s ({rate / base:.3f}x none), "
              f"{cpu:.2f} CPU-s per process (median of {rounds})")


if __name__ == "__main__":
    main()
