"""tools/kill_resume.py, the documented SIGKILL/resume check (docs/guide/determinism.md), run as a
user runs it, at the smallest settings that still kill during an asynchronous save: one trial of
an 8-step run, killed while a save is unfinished (proven after the kill), resumed to the bits of
the uninterrupted run."""

import re

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.slow


def test_kill_resume_tool_kills_during_a_save_and_resumes_to_the_same_bits(tmp_path):
  out = run_cli("tools/kill_resume.py", "--trials=1", "--steps=8", "--save_fraction=1", "--seed=0",
                f"--data={tmp_path / 'data'}", f"--out={tmp_path / 'runs'}", timeout=300)
  assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
  lines = out.stdout.splitlines()
  assert lines[0].startswith("kernels: the train step calls nsl_flash_cpu_fwd"), lines
  trial = [l for l in lines if l.startswith("trial 1:")]
  assert len(trial) == 1 and re.search(r"during an async save after step \d+ \(left unfinished: \d+\.orbax", trial[0]) \
      and trial[0].endswith("bit-identical"), lines
  assert lines[-1] == "1/1 SIGKILL/resume trials bit-identical to the uninterrupted run", lines
