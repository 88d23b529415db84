"""The package's annotations, which it ships to type checkers (py.typed), are consistent, and a
type checker reading them catches a wrongly typed call in a user's script."""

import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def mypy(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir", str(cwd / ".mypy"),
         *args],
        capture_output=True, text=True, cwd=cwd, env={**os.environ, "MYPYPATH": str(PACKAGE)},
    )


def test_the_package_type_checks(tmp_path):
    out = mypy("--ignore-missing-imports", str(PACKAGE / "insitubatch"), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_user_script_is_checked_against_the_annotations(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import insitubatch as isb\n"
        "ds = isb.InSituDataset('era5.zarr', batch_size='32')\n"
        "for batch in ds.train:\n"
        "    n: str = batch.sample_indices\n"
    )
    out = mypy("--ignore-missing-imports", str(script), cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if "error:" in line]
    assert any("train.py:2:" in line and "batch_size" in line for line in lines), out.stdout
    assert any("train.py:4:" in line for line in lines), out.stdout
    assert len(lines) == 2, out.stdout
