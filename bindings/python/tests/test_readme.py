"""The README's Python and C examples work as printed (on a small store at the path they use,
rewritten to a temporary directory)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = ROOT / "target" / "release" / "insitubatch"
LIB = ROOT / "target" / "release" / "libinsitubatch.so"


def block(lang, index=0):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)
    assert len(blocks) > index, f"no {lang} block number {index} in README.md"
    return blocks[index]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    if not BIN.is_file():
        pytest.skip("needs `cargo build --release`")
    s = tmp_path_factory.mktemp("readme") / "era5.zarr"
    subprocess.run([BIN, "make-dataset", s, "--samples", "64", "--grid", "16x32"], check=True,
                   capture_output=True)
    return s


def test_python_cache_example(store, tmp_path):
    code = block("python", 1).replace("/tmp/era5.zarr", str(store))
    code = code.replace("/tmp/era5-cache/v1", str(tmp_path / "cache" / "v1"))
    script = tmp_path / "cache_ex.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bindings" / "python"), "INSITUBATCH_LIB": str(LIB)}
    out = subprocess.run([sys.executable, script], check=True, capture_output=True, text=True, env=env)
    # 64 samples in chunks of 8, two variables: 16 chunks, every one revived, nothing decoded.
    assert "64 samples, 16 chunks revived, 0 bytes decoded" in out.stdout, out.stdout


def test_python_transforms_example(store, tmp_path):
    code = block("python", 2).replace("/tmp/era5.zarr", str(store))
    script = tmp_path / "transforms_ex.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bindings" / "python"), "INSITUBATCH_LIB": str(LIB)}
    out = subprocess.run([sys.executable, script], check=True, capture_output=True, text=True, env=env)
    # The synthetic t2m is ERA5-like, in kelvin around 270, so in Celsius it straddles zero.
    low, high = map(float, re.findall(r"from (\S+) to (\S+) degrees", out.stdout)[0])
    assert -60 < low < 0 < high < 60, out.stdout


def test_python_example(store, tmp_path):
    code = block("python").replace("/tmp/era5.zarr", str(store))
    script = tmp_path / "ex.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bindings" / "python"), "INSITUBATCH_LIB": str(LIB)}
    out = subprocess.run([sys.executable, script], check=True, capture_output=True, text=True, env=env)
    # 64 samples in chunks of 8: val is one chunk, 8 samples, one (short) batch.
    assert "epoch 1:" in out.stdout and "val: 8 samples in 1 batches" in out.stdout, out.stdout


def test_c_example(store, tmp_path):
    src = tmp_path / "ex.c"
    src.write_text(block("c").replace("/tmp/era5.zarr", str(store)))
    exe = tmp_path / "ex"
    subprocess.run(["cc", "-Wall", "-Werror", src, f"-I{ROOT / 'bindings/c/include'}",
                    f"-L{LIB.parent}", "-linsitubatch", f"-Wl,-rpath,{LIB.parent}", "-o", exe],
                   check=True)
    out = subprocess.run([exe], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "64 samples"


def test_transforms_example(tmp_path):
    """examples/python/transforms.py: a chunk transform and a batch transform, two epochs."""
    if not BIN.is_file():
        pytest.skip("needs `cargo build --release`")
    store = tmp_path / "wind.zarr"
    subprocess.run([BIN, "make-dataset", store, "--samples", "48", "--grid", "12x20",
                    "--variables", "t2m,u10,v10"], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bindings" / "python"), "INSITUBATCH_LIB": str(LIB)}
    out = subprocess.run([sys.executable, ROOT / "examples" / "python" / "transforms.py", store],
                         check=True, capture_output=True, text=True, env=env).stdout
    epochs = re.findall(r"epoch (\d): (\d+) samples .* t2m (\S+)\.\.(\S+) degC, wind (\S+)\.\.", out)
    assert [(e, n) for e, n, *_ in epochs] == [("0", "48"), ("1", "48")], out
    for _, _, low, high, wind_low in epochs:
        # Kelvin-like synthetic fields shifted to Celsius; wind is the norm of two such fields.
        assert -100 < float(low) < float(high) < 100 and float(wind_low) > 0, out


def test_fit_scaler_example(tmp_path):
    """examples/python/fit_scaler.py: fit over the loader, then train on revived raw chunks."""
    if not BIN.is_file():
        pytest.skip("needs `cargo build --release`")
    store = tmp_path / "era5.zarr"
    subprocess.run([BIN, "make-dataset", store, "--samples", "64", "--grid", "16x32"], check=True,
                   capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bindings" / "python"), "INSITUBATCH_LIB": str(LIB)}
    out = subprocess.run([sys.executable, ROOT / "examples" / "python" / "fit_scaler.py", store,
                          tmp_path / "cache"], check=True, capture_output=True, text=True,
                         env=env).stdout
    epochs = re.findall(r"epoch (\d): 0 misses, (\d+) hits \((\d+) from cache files\), 0 bytes "
                        r"decoded; t2m mean (\S+) std (\S+), u10 mean (\S+) std (\S+)", out)
    assert [e[0] for e in epochs] == ["0", "1"], out
    assert epochs[0][1:3] == ("16", "16"), out  # 64 samples, 8 per chunk, 2 variables: revived
    for *_, tm, ts, um, us in epochs:
        assert abs(float(tm)) < 1e-3 and abs(float(um)) < 1e-3, out
        assert abs(float(ts) - 1) < 1e-3 and abs(float(us) - 1) < 1e-3, out
