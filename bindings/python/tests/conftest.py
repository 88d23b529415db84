"""Fixtures written by zarr-python at test time (the same script the Rust suites use)."""

import json
import re
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


@pytest.fixture(scope="session")
def python_docs_example():
    """The first Python example after the heading (or bold lead) `heading` in
    docs/python-api.md, as text to run: the tests run the docs' examples as printed."""
    text = (ROOT / "docs" / "python-api.md").read_text()

    def example(heading: str) -> str:
        assert heading in text, f"no {heading!r} in docs/python-api.md"
        section = text.split(heading, 1)[1]
        return re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]

    return example
