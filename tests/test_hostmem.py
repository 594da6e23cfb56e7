"""`python -m nsl.…` commands re-execute once with glibc's huge-page malloc where it is available."""

import os
import subprocess
import sys

import pytest

from nsl import hostmem


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", hostmem.OPT_OUT)}
  return env | extra


def _run(env):
  out = subprocess.run([sys.executable, "-m", "nsl"], env=env, capture_output=True, text=True, check=True)
  assert out.stderr == ""
  return out.stdout.split("host huge pages: ")[1].splitlines()[0].strip()  # its line of `python -m nsl`


def test_nsl_module_reads_only_python_dash_m_nsl_command_lines():
  assert hostmem.nsl_module(["python", "-m", "nsl.launch", "--config=x"]) == "nsl.launch"
  assert hostmem.nsl_module(["python", "-u", "-m", "nsl.bench.train_step"]) == "nsl.bench.train_step"
  assert hostmem.nsl_module(["python", "-m", "pytest", "-m", "nsl.x"]) is None  # pytest's own -m
  assert hostmem.nsl_module(["python", "-m", "nslx"]) is None
  assert hostmem.nsl_module(["python", "script.py"]) is None
  assert hostmem.nsl_module(["python", "-m"]) is None


def test_command_reexecutes_with_huge_pages_and_opt_out_is_honoured(monkeypatch):
  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  monkeypatch.delenv(hostmem.OPT_OUT, raising=False)
  if hostmem.status() != "off":  # no glibc >= 2.35 or no madvise THP here: nothing to switch on
    pytest.skip(f"huge pages not available to switch on here: {hostmem.status()}")
  assert _run(_env()) == "on"
  assert _run(_env(**{hostmem.OPT_OUT: "0"})) == f"off ({hostmem.OPT_OUT}=0)"
  # the user's own setting wins: not re-executed, reported as it is
  assert _run(_env(GLIBC_TUNABLES="glibc.malloc.hugetlb=0")) == "off (GLIBC_TUNABLES sets glibc.malloc.hugetlb=0)"


def test_importing_nsl_does_not_reexecute():
  code = "import os, nsl; print(os.environ.get('GLIBC_TUNABLES', 'unset'))"
  out = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "unset"
