"""The kernels live in the top-level kernels/ folder and import as `nsl.kernels` (pyproject's
package-dir), so nothing installs a top-level package named `kernels` over PyPI's. The folder has
no `__init__.py`, so from the checkout's root `import kernels` finds PyPI's package, not ours
(docs/design.md#kernels-folder). An editable install (the one `make` makes) and a built wheel must
both import the kernels."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

ROOT = Path(ROOT)
# Prints where nsl, one kernel module and the top-level `kernels` were imported from.
WHERE = ("import nsl, nsl.kernels.cpu_build as c, kernels; "
         "print(nsl.__file__); print(c.__file__); print(kernels.__file__)")


def _pyproject() -> dict:
  return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _tree_packages() -> set[str]:
  pkgs = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "nsl").rglob("__init__.py")}
  if (ROOT / "kernels").is_dir():
    pkgs.add("nsl.kernels")
  return pkgs


def _pypi_kernels() -> Path:
  """The `kernels` distribution's __init__.py (transformers >= 5 requires it; the [hf] extra)."""
  try:
    return Path(importlib.metadata.distribution("kernels").locate_file("kernels/__init__.py"))
  except importlib.metadata.PackageNotFoundError:
    pytest.fail("PyPI's `kernels` is not installed: make install brings it with the [hf] extra")


def _where(cwd: Path, site: Path | None = None) -> list[Path]:
  """WHERE's three paths from a Python started in `cwd` (sys.path[0] is that folder, as for a
  script or `python -c`). With `site`, the installs in that folder (its .pth files run) instead of
  this venv's nsl, whose editable finder would otherwise answer first; the venv's other packages stay
  reachable, after it."""
  code = WHERE
  if site is not None:
    venv = sysconfig.get_paths()["purelib"]
    code = f"import site, sys; site.addsitedir({str(site)!r}); sys.path.append({venv!r}); " + code
  cmd = [sys.executable] + (["-S"] if site is not None else []) + ["-c", code]
  out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-3000:]
  return [Path(line) for line in out.stdout.split()]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
  """What pip builds from: pyproject, README, nsl/ and kernels/ in a fresh folder."""
  src = tmp_path_factory.mktemp("src")
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(ROOT / name, src / name)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for name in ("nsl", "kernels"):
    shutil.copytree(ROOT / name, src / name, ignore=ignore)
  return src


def test_pyproject_lists_every_package_in_the_tree():
  setup = _pyproject()["tool"]["setuptools"]
  assert set(setup["packages"]) == _tree_packages()
  assert setup["package-dir"] == {"nsl.kernels": "kernels"}
  assert not (ROOT / "nsl" / "kernels").exists(), "the kernels' home is the top-level kernels/ folder"
  assert not (ROOT / "kernels" / "__init__.py").exists(), \
      "kernels/__init__.py would make the folder a regular package that shadows PyPI's `kernels`"


def test_checkout_root_imports_pypi_kernels_and_ours_as_nsl_kernels():
  """From the root, sys.path[0] holds our kernels/ folder; a namespace portion loses to the installed
  regular package, which transformers >= 5 imports."""
  nsl_init, cpu_build, kernels = _where(ROOT)
  assert nsl_init == ROOT / "nsl" / "__init__.py"
  assert cpu_build == ROOT / "kernels" / "cpu_build.py"
  assert kernels == _pypi_kernels()


def test_editable_install_imports_the_kernels(source, tmp_path):
  """The editable install `make install` makes, built afresh from today's pyproject: setuptools'
  finder lists nsl.kernels as a namespace it cannot map (pypa/setuptools#4943) and nsl's own finder
  answers, from the source's root and from elsewhere."""
  out = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                        "print(b.build_editable(sys.argv[1]))", str(tmp_path / "dist")],
                       cwd=source, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-3000:]
  site = tmp_path / "site"
  zipfile.ZipFile(tmp_path / "dist" / out.stdout.split()[-1]).extractall(site)
  assert "nsl.kernels" in next(site.glob("__editable__*finder.py")).read_text()
  for cwd in (source, tmp_path):
    nsl_init, cpu_build, kernels = _where(cwd, site)
    assert (nsl_init, cpu_build) == (source / "nsl" / "__init__.py", source / "kernels" / "cpu_build.py")
    assert kernels == _pypi_kernels()


@pytest.mark.slow
def test_built_wheel_holds_and_imports_nsl_kernels(source, tmp_path):
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                  "-w", str(tmp_path / "dist"), str(source)], check=True, capture_output=True)
  (wheel,) = (tmp_path / "dist").glob("nsl-*.whl")
  names = zipfile.ZipFile(wheel).namelist()
  assert {"nsl/kernels/common.py", "nsl/kernels/cpu_build.py", "nsl/kernels/flash_cpu.cc",
          "nsl/kernels/cpu_simd.h"} <= set(names)
  assert not [n for n in names if n.startswith("kernels/")], "no top-level `kernels` package"
  site = tmp_path / "site"
  zipfile.ZipFile(wheel).extractall(site)
  nsl_init, cpu_build, kernels = _where(tmp_path, site)
  assert (nsl_init, cpu_build) == (site / "nsl" / "__init__.py", site / "nsl" / "kernels" / "cpu_build.py")
  assert kernels == _pypi_kernels()
