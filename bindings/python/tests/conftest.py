"""Fixtures written by zarr-python at test time (the same script the Rust suites use)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def fixtures(tmp_path_factory):
    out = tmp_path_factory.mktemp("zarr-fixtures")
    subprocess.run(
        [sys.executable, str(ROOT / "tests" / "fixtures" / "make_fixtures.py"), str(out)],
        check=True,
        capture_output=True,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    return out, manifest
