"""RandomCrop against a per-sample Python loop that cuts the same windows, and against copying the
whole batch once, in one process (docs/benchmarks.md, "Random crops").

    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \
        python3 bench/random_crop.py [--repeat 30]
"""

import argparse
import time

import numpy as np

import insitubatch as isb
from insitubatch.augment import RandomCrop

CASES = [
    # (name, batch shape, window, wrap)
    ("ERA5 field, 64x64 patches", (32, 181, 360), (64, 64), (False, False)),
    ("ERA5 field, 128x128 patches", (32, 181, 360), (128, 128), (False, False)),
    ("ERA5 field, 64x128, periodic longitude", (32, 181, 360), (64, 128), (False, True)),
    ("13 levels, 64x64 patches", (16, 13, 181, 360), (64, 64), (False, False)),
    ("small tiles, 16x16 of 64x64", (512, 64, 64), (16, 16), (False, False)),
]


def loop_crop(x, origins, size, wrap):
    """The same windows, one sample at a time."""
    out = np.empty(x.shape[:-2] + size, dtype=x.dtype)
    for r in range(x.shape[0]):
        i, j = origins[r]
        rows = x[r, ..., i:i + size[0], :]
        if wrap[1]:
            out[r] = np.take(rows, np.arange(j, j + size[1]) % x.shape[-1], axis=-1)
        else:
            out[r] = rows[..., j:j + size[1]]
    return out


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=30)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print("| batch | window | RandomCrop ms | per-sample loop ms | loop / RandomCrop "
          "| copy of the whole batch ms | crop / batch copy |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, shape, size, wrap in CASES:
        x = rng.standard_normal(shape, dtype=np.float32)
        crop = RandomCrop(size, wrap=wrap, seed=1)

        def batch():
            return isb.Batch({"x": x}, np.arange(shape[0], dtype=np.int64), {"x": 0}, epoch=3)

        origins = crop.origins(batch())
        np.testing.assert_array_equal(crop(batch()).arrays["x"], loop_crop(x, origins, size, wrap))
        t_crop = best(lambda: crop(batch()), args.repeat)
        t_loop = best(lambda: loop_crop(x, origins, size, wrap), args.repeat)
        t_copy = best(lambda: x.copy(), args.repeat)
        print(f"| {name} {shape} | {size}{' wrap' if any(wrap) else ''} | {t_crop * 1e3:.3f} | "
              f"{t_loop * 1e3:.3f} | {t_loop / t_crop:.2f}x | {t_copy * 1e3:.3f} | "
              f"{t_crop / t_copy:.2f} |")


if __name__ == "__main__":
    main()
