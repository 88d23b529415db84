"""`pip install ./bindings/python` gives a working `import insitubatch` in a fresh venv (the
library is bundled into the package; INSITUBATCH_LIB points the build at the one `cargo build`
made, so the test does not rebuild it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LIB = ROOT / "target" / "release" / "libinsitubatch.so"


@pytest.mark.skipif(not LIB.is_file(), reason="needs `cargo build --release` first")
def test_pip_install_into_a_fresh_venv_imports_and_reads(tmp_path, fixtures):
    venv = tmp_path / "venv"
    # System site packages give the venv numpy without a download; the package itself and its
    # library come only from the install.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "INSITUBATCH_LIB")}
    subprocess.run(
        [py, "-m", "pip", "install", "--quiet", "--no-deps",
         str(ROOT / "bindings" / "python")],
        check=True,
        env={**env, "INSITUBATCH_LIB": str(LIB)},
        cwd=tmp_path,
    )
    store = fixtures[0] / "era5_v3.zarr"
    code = (
        "import insitubatch as isb, sys;"
        "import pathlib;"
        "assert 'site-packages' in isb.__file__, isb.__file__;"
        # PEP 561: type checkers read the package's annotations only when this marker ships.
        "assert (pathlib.Path(isb.__file__).parent / 'py.typed').is_file();"
        f"ds = isb.InSituDataset({str(store)!r}, batch_size=4);"
        "print(sum(len(b) for b in ds.train))"
    )
    out = subprocess.run([py, "-c", code], check=True, env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "12"
