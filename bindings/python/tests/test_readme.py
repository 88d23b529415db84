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


def shim_env():
    """The environment in which an example imports the shim from the checkout, uninstalled."""
    return {**os.environ, "PYTHONPATH": str(ROOT / "bindings" / "python"), "INSITUBATCH_LIB": str(LIB)}


def make_store(store, *args):
    """`insitubatch make-dataset store *args` (skipped without the release build); `store`."""
    if not BIN.is_file():
        pytest.skip("needs `cargo build --release`")
    subprocess.run([BIN, "make-dataset", store, *args], check=True, capture_output=True)
    return store


def forecast_store(tmp_path):
    """The store the training and inference examples run on: 64 chunks of 4 samples."""
    return make_store(tmp_path / "era5.zarr", "--samples", "256", "--grid", "16x32",
                      "--sample-chunk", "4")


def block(lang, index=0):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)
    assert len(blocks) > index, f"no {lang} block number {index} in README.md"
    return blocks[index]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("readme") / "era5.zarr", "--samples", "64",
                      "--grid", "16x32")


def test_python_cache_example(store, tmp_path):
    code = block("python", 1).replace("/tmp/era5.zarr", str(store))
    code = code.replace("/tmp/era5-cache/v1", str(tmp_path / "cache" / "v1"))
    script = tmp_path / "cache_ex.py"
    script.write_text(code)
    env = shim_env()
    out = subprocess.run([sys.executable, script], check=True, capture_output=True, text=True, env=env)
    # 64 samples in chunks of 8, two variables: 16 chunks, every one revived, nothing decoded.
    assert "64 samples, 16 chunks revived, 0 bytes decoded" in out.stdout, out.stdout


def test_python_transforms_example(store, tmp_path):
    code = block("python", 2).replace("/tmp/era5.zarr", str(store))
    script = tmp_path / "transforms_ex.py"
    script.write_text(code)
    env = shim_env()
    out = subprocess.run([sys.executable, script], check=True, capture_output=True, text=True, env=env)
    # The synthetic t2m is ERA5-like, in kelvin around 270, so in Celsius it straddles zero.
    low, high = map(float, re.findall(r"from (\S+) to (\S+) degrees", out.stdout)[0])
    assert -60 < low < 0 < high < 60, out.stdout


def test_python_example(store, tmp_path):
    code = block("python").replace("/tmp/era5.zarr", str(store))
    script = tmp_path / "ex.py"
    script.write_text(code)
    env = shim_env()
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
    store = make_store(tmp_path / "wind.zarr", "--samples", "48", "--grid", "12x20",
                       "--variables", "t2m,u10,v10")
    env = shim_env()
    out = subprocess.run([sys.executable, ROOT / "examples" / "python" / "transforms.py", store],
                         check=True, capture_output=True, text=True, env=env).stdout
    epochs = re.findall(r"epoch (\d): (\d+) samples .* t2m (\S+)\.\.(\S+) degC, wind (\S+)\.\.", out)
    assert [(e, n) for e, n, *_ in epochs] == [("0", "48"), ("1", "48")], out
    for _, _, low, high, wind_low in epochs:
        # Kelvin-like synthetic fields shifted to Celsius; wind is the norm of two such fields.
        assert -100 < float(low) < float(high) < 100 and float(wind_low) > 0, out


def test_fit_scaler_example(tmp_path):
    """examples/python/fit_scaler.py: fit over the loader, then train on revived raw chunks."""
    store = make_store(tmp_path / "era5.zarr", "--samples", "64", "--grid", "16x32")
    env = shim_env()
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


def test_train_torch_example_learns_resumes_where_it_stopped_and_runs_two_ranks(tmp_path):
    """examples/python/train_torch.py: a forecaster past persistence, a stopped run resumed to the
    same model as an unbroken one, and two torchrun ranks each reading its own share."""
    pytest.importorskip("torch")
    store = forecast_store(tmp_path)
    script = ROOT / "examples" / "python" / "train_torch.py"
    env = shim_env()

    def run(*args, launcher=()):
        return subprocess.run([sys.executable, *launcher, script, store, "--epochs", "2", *args],
                              check=True, capture_output=True, text=True, env=env).stdout

    def epochs(out):
        return re.findall(r"epoch (\d): (\d+) samples, .* val mse (\S+) against persistence (\S+) "
                          r"\(skill (\S+)\)", out)

    # 64 chunks of 4 samples; train holds 51 of them (204 samples) in batches of 16.
    unbroken = run()
    assert "train: 204 samples per epoch and rank in 13 batches, 1 rank(s)" in unbroken, unbroken
    e = epochs(unbroken)
    assert [(n, s) for n, s, *_ in e] == [("0", "204"), ("1", "204")], unbroken
    assert float(e[1][2]) < 0.5 * float(e[1][3]), f"no better than persistence:\n{unbroken}"

    ckpt = tmp_path / "fc.pt"
    stopped = run("--checkpoint", str(ckpt), "--stop-after", "5")
    assert "stopped after 5 steps, at epoch 0, batch 5" in stopped, stopped
    resumed = run("--checkpoint", str(ckpt))
    assert "resumed at epoch 0, batch 5" in resumed, resumed
    r = epochs(resumed)
    # The rest of epoch 0 (204 - 5 * 16 samples), then a whole epoch: the same batches in the same
    # order as the unbroken run, so the same model and the same validation error.
    assert [(n, s) for n, s, *_ in r] == [("0", "124"), ("1", "204")], resumed
    assert [v for *_, v, _, _ in r] == [v for *_, v, _, _ in e], (unbroken, resumed)

    two = run("--epochs", "1", "--cache-dir", str(tmp_path / "cache"),
              launcher=("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"))
    # Train is cut into two near-equal shares, each rank stopping at the shorter; validation
    # covers the whole split once across the ranks, so persistence scores as in one process.
    assert "train: 100 samples per epoch and rank in 7 batches, 2 rank(s)" in two, two
    d = epochs(two)
    assert [(n, s) for n, s, *_ in d] == [("0", "100")] and d[0][3] == e[0][3], (two, unbroken)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["rank0", "rank1"]


def test_infer_jax_examples_chunk_writer_stores_each_chunk_once_and_whole():
    """The example's ChunkWriter: rows arriving in any order are stored one whole chunk per
    write, as soon as the chunk's last expected row is in; rows not expected keep the fill
    value; a row given twice, or one missing at the end, is an error."""
    pytest.importorskip("jax")
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location(
        "infer_jax", ROOT / "examples" / "python" / "infer_jax.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Recorder:  # the part of a zarr array the writer uses, recording each store
        shape, chunks, fill_value = (10, 2), (4, 2), np.nan

        def __init__(self):
            self.data, self.writes = np.full(self.shape, np.nan), []

        def __setitem__(self, key, value):
            self.writes.append((key.start, key.stop))
            self.data[key] = value

    out = Recorder()
    expected = np.array([9, 1, 2, 3, 5, 6, 7, 8])  # not 0 or 4: they stay NaN
    writer = module.ChunkWriter(out, expected)
    rng = np.random.default_rng(0)
    for part in np.array_split(rng.permutation(expected), 3):
        writer.write(part, np.stack([part * 10.0, part * 10.0 + 1], axis=1))
    writer.close()
    assert sorted(out.writes) == [(0, 4), (4, 8), (8, 10)], out.writes
    want = np.stack([np.arange(10) * 10.0, np.arange(10) * 10.0 + 1], axis=1)
    want[[0, 4]] = np.nan
    np.testing.assert_array_equal(out.data, want)
    with pytest.raises(ValueError, match="came twice"):
        writer.write(np.array([1]), np.zeros((1, 2)))
    short = module.ChunkWriter(Recorder(), expected)
    short.write(np.array([1, 2]), np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"rows of chunks \[0\] never came"):
        short.close()


def test_infer_jax_example_writes_each_forecast_once_at_its_valid_time(tmp_path):
    """examples/python/infer_jax.py: a stencil fitted in JAX beats persistence, and its forecasts
    land in the new array exactly at the times they are valid for, each equal to the stencil
    applied (here, in numpy) to the source field `lead` steps earlier; everything else is NaN."""
    pytest.importorskip("jax")
    zarr = pytest.importorskip("zarr")
    import numpy as np

    store = forecast_store(tmp_path)
    source = zarr.open_array(store, path="t2m")[:]
    env = shim_env()

    def run(out, *args):
        stdout = subprocess.run([sys.executable, ROOT / "examples" / "python" / "infer_jax.py",
                                 store, out, *args], check=True, capture_output=True, text=True,
                                env=env).stdout
        m = re.search(r"wrote (\d+) forecasts .* mse (\S+) against persistence (\S+)", stdout)
        assert m, stdout
        forecast = zarr.open_array(out, path="t2m_forecast")
        assert forecast.shape == source.shape and forecast.chunks == (4, 16, 32)
        return stdout, int(m[1]), float(m[2]), float(m[3]), forecast

    def expected(forecast, times):
        """The stencil from the array's attributes applied to the source at t - lead."""
        attrs = forecast.attrs
        x = source[times - attrs["lead"]].astype(np.float64)
        step = sum(w * (np.roll(x, -m, axis=-1) - x)
                   for m, w in zip(attrs["stencil_offsets"], attrs["stencil_weights"]))
        return x + step

    def one_run_each_written_once(out, n, forecast):
        """The written times are one run of consecutive times, as many as were forecast, each
        holding the stencil's value."""
        values = forecast[:]
        times = np.flatnonzero(~np.isnan(values).all(axis=(1, 2)))
        assert len(times) == n > 0 and np.all(np.diff(times) == 1), out
        assert not np.isnan(values[times]).any(), "a written forecast holds NaN"
        np.testing.assert_allclose(values[times], expected(forecast, times), rtol=0, atol=2e-3)

    # The test split, lead 1, read in order.
    out, n, mse, persistence, forecast = run(tmp_path / "test.zarr")
    one_run_each_written_once(out, n, forecast)
    assert mse < 0.1 * persistence, f"the stencil is no better than persistence:\n{out}"

    # The shuffled train split: batches of scattered times, gathered into whole chunks.
    out, n, _, _, forecast = run(tmp_path / "train.zarr", "--split", "train")
    one_run_each_written_once(out, n, forecast)

    # Every anchor in order, lead 3: the forecasts are valid from t = 3 to the last time; the
    # last three anchors would read past the array's end and are not forecast from.
    out, n, _, _, forecast = run(tmp_path / "all.zarr", "--split", "all", "--lead", "3")
    values = forecast[:]
    assert n == 253, out
    assert np.isnan(values[:3]).all() and not np.isnan(values[3:]).any(), out
    np.testing.assert_allclose(values[3:], expected(forecast, np.arange(3, 256)), rtol=0,
                               atol=2e-3)
