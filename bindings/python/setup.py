"""Builds (or takes) libinsitubatch.so and ships it inside the package, so `pip install
./bindings/python` gives a working `import insitubatch`. Set INSITUBATCH_LIB to bundle an
already-built library instead of running `cargo build --release`."""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _library() -> Path:
    given = os.environ.get("INSITUBATCH_LIB")
    if given:
        return Path(given)
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    subprocess.run(
        [cargo, "build", "--release", "-p", "insitubatch-capi"], cwd=REPO, check=True
    )
    return REPO / "target" / "release" / "libinsitubatch.so"


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = _library()
        if not lib.is_file():
            raise SystemExit(f"insitubatch: {lib} was not built")
        dest = Path(self.build_lib) / "insitubatch" / "libinsitubatch.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it is platform specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
