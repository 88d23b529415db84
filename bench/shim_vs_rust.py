"""Steady epochs of the Python shim against the Rust API on the harness's stores, interleaved.

    cargo build --release
    python3 bench/shim_vs_rust.py [DIR] [ROUNDS] [EPOCHS]

The harness (`make bench-harness`) runs each engine once, so its steady figure for either
insitubatch engine rests on a few 0.2-second epochs. This runs the two insitubatch engines the way
the harness runs them, on the stores it builds (512 samples of 181 x 360 float32, two variables,
zstd-3, 1 and 8 samples per chunk), ROUNDS times (default 5), alternating, for EPOCHS epochs each
(default 6), and prints the median and range of the later epochs' samples/s per engine and the
shim's ratio to Rust.
"""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench-harness"))
from run import BIN, ENGINES, make_store, rust_epochs, shim_env  # noqa: E402


def rust(path: Path, epochs: int) -> list[float]:
    out = subprocess.run([BIN, "bench", path, "--epochs", str(epochs), "--json"],
                         check=True, capture_output=True, text=True).stdout
    return [e["samples_per_s"] for e in rust_epochs(out)[1:]]


def shim(path: Path, epochs: int) -> list[float]:
    out = subprocess.run([sys.executable, ENGINES, "insitubatch-python", path,
                          "--epochs", str(epochs)], check=True, capture_output=True, text=True,
                         env={**os.environ, **shim_env()}).stdout
    return [e["samples_per_s"] for e in json.loads(out)["epochs"][1:]]


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/insitubatch-harness")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    directory.mkdir(parents=True, exist_ok=True)
    for spc in (1, 8):
        path = make_store(directory, spc, 512, "181x360")
        got = {"Rust": [], "shim": []}
        for _ in range(rounds):
            got["Rust"] += rust(path, epochs)
            got["shim"] += shim(path, epochs)
        med = {k: statistics.median(v) for k, v in got.items()}
        for k, v in got.items():
            print(f"{spc:2d} samples/chunk  {k:4s}  median {med[k]:7.0f} samples/s"
                  f"  [{min(v):.0f}-{max(v):.0f}], {len(v)} epochs")
        print(f"{spc:2d} samples/chunk  shim / Rust  {med['shim'] / med['Rust']:.2f}")


if __name__ == "__main__":
    main()
