"""tests/skipcheck.py judged on a run of its own: a skip for a missing extra or a file beside the
checkout fails a CI run (and is named), a skip for a fact of the host does not, and outside CI
both are only listed."""

import os
import subprocess
import sys

from tests.helpers import ROOT

FILE = """
import pytest

def test_host_fact():
  pytest.skip("host fact: no /dev/full")

def test_{name}():
  pytest.skip({reason!r})

def test_runs():
  assert True
"""


def _run(tmp_path, reason, ci):
  test = tmp_path / "test_sample.py"
  test.write_text(FILE.format(name="second", reason=reason))
  env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("PYTEST_")}
  env.update({"CI": "true"} if ci else {})
  return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.skipcheck", "-p", "no:cacheprovider",
                         f"--rootdir={tmp_path}", str(test)], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=120)


def test_a_skip_for_a_missing_extra_or_an_outside_file_fails_ci(tmp_path):
  outside = os.path.join(os.path.dirname(ROOT), "shared", "data", "gpt2.tiktoken")
  for reason in ("ray is not installed: pip install '.[ray]'", "the [tpu] extra (libtpu) runs TPU compiles",
                 f"no {outside}"):
    out = _run(tmp_path, reason, ci=True)
    assert out.returncode == 1, out.stdout[-2000:]
    assert "skip reasons (2 skipped)" in out.stdout and "1 x host fact: no /dev/full" in out.stdout, out.stdout
    assert f"fails the run (CI=true): test_sample.py::test_second: {reason}" in out.stdout, out.stdout
    out = _run(tmp_path, reason, ci=False)
    assert out.returncode == 0 and "would fail in CI" in out.stdout, out.stdout[-2000:]


def test_a_skip_for_a_host_fact_passes_ci(tmp_path):
  out = _run(tmp_path, "host fact: cannot mount a tmpfs here", ci=True)
  assert out.returncode == 0, out.stdout[-2000:]
  assert "skip reasons (2 skipped)" in out.stdout and "would fail" not in out.stdout and "fails the run" not in out.stdout
