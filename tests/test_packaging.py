"""The kernels live in the top-level kernels/ folder and import as `nsl.kernels` (pyproject's
package-dir), so nothing installs a top-level package named `kernels` over PyPI's. Both an
editable install (the one `make` makes) and a built wheel must import them."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

ROOT = Path(ROOT)


def _pyproject() -> dict:
  return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _tree_packages() -> set[str]:
  pkgs = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "nsl").rglob("__init__.py")}
  if (ROOT / "kernels" / "__init__.py").is_file():
    pkgs.add("nsl.kernels")
  return pkgs


def test_pyproject_lists_every_package_in_the_tree():
  setup = _pyproject()["tool"]["setuptools"]
  assert set(setup["packages"]) == _tree_packages()
  assert setup["package-dir"] == {"nsl.kernels": "kernels"}
  assert not (ROOT / "nsl" / "kernels").exists(), "the kernels' home is the top-level kernels/ folder"


def test_editable_install_imports_the_kernels_from_kernels_folder():
  out = subprocess.run([sys.executable, "-c", "import nsl.kernels.cpu_build as c; print(c.SOURCES[0])"],
                       cwd="/", capture_output=True, text=True, check=True).stdout.strip()
  assert Path(out) == ROOT / "kernels" / "flash_cpu.cc"


@pytest.mark.slow
def test_built_wheel_holds_and_imports_nsl_kernels(tmp_path):
  src = tmp_path / "src"
  src.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(ROOT / name, src / name)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for name in ("nsl", "kernels"):
    shutil.copytree(ROOT / name, src / name, ignore=ignore)
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                  "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True)
  (wheel,) = (tmp_path / "dist").glob("nsl-*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  assert {"nsl/kernels/__init__.py", "nsl/kernels/flash_cpu.cc", "nsl/kernels/cpu_simd.h"} <= set(names)
  assert not [n for n in names if n.startswith("kernels/")], "no top-level `kernels` package"
  site = tmp_path / "site"
  zipfile.ZipFile(wheel).extractall(site)
  # The wheel's copy comes first on the path; the editable install's finder sits after the path
  # finder in sys.meta_path, so it cannot answer for nsl.kernels.
  out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                        "import nsl.kernels.cpu_build as c; print(c.SOURCES[0])", str(site)],
                       cwd=tmp_path, capture_output=True, text=True, check=True)
  assert Path(out.stdout.strip()) == site / "nsl" / "kernels" / "flash_cpu.cc"
