"""Checkpoint faults stay quiet and right (issue #39): what tests/train/test_recovery.py leaves out —
an evaluation's error is its only line (no Orbax absl warnings before it), a step without its
tree metadata is damage and not "another architecture", a resume under another family says
that the family changed, and the reads a failed restore abandons print nothing at collection."""

import logging
import os
import shutil
import subprocess
import sys

import pytest

from nsl import launch
from nsl.evals import nll
from nsl.train import loop
from tests.helpers import ROOT, SUBPROCESS_XLA_FLAGS, make_corpus, tiny_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A finished 6-step run of the tiny standard model with checkpoints at steps 3 and 6."""
  data_dir = make_corpus(str(tmp_path_factory.mktemp("corpus")), n=4, chars=3000)
  workdir = str(tmp_path_factory.mktemp("runs") / "base")
  import jax
  loop.Trainer(tiny_config(data_dir), workdir, progress=False, devices=jax.devices()[:1]).run()
  return data_dir, workdir


def _copy(workdir, tmp_path):
  dst = str(tmp_path / "run")
  shutil.copytree(workdir, dst)
  return dst


def test_eval_of_steps_without_tree_metadata_is_one_line_naming_damage(finished, tmp_path, capfd, caplog):
  workdir = _copy(finished[1], tmp_path)
  for step in ("3", "6"):
    os.remove(os.path.join(workdir, "checkpoints", step, "state", "_METADATA"))
  capfd.readouterr()
  assert nll.main([f"--workdir={workdir}"]) == 2
  lines = [l for l in capfd.readouterr().err.splitlines() if l.strip()]
  # Orbax's read-only manager notices (pytest takes log records away from stderr: read both)
  assert not [l for l in lines if "absl" in l], lines
  assert not [r.getMessage() for r in caplog.records if r.name == "absl" and r.levelno >= logging.WARNING]
  errors = [l for l in lines if l.startswith("nsl: error")]
  assert len(errors) == 1 and "every checkpoint" in errors[0] and "is damaged" in errors[0], lines
  assert lines[-1] == errors[0] and all(l.startswith("nsl: warning") for l in lines[:-1]), lines


def test_resume_under_another_family_says_the_family_changed(finished, tmp_path, capsys):
  data_dir, base = finished
  workdir = _copy(base, tmp_path)
  cfg = tmp_path / "sps.py"
  cfg.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom tests.helpers import tiny_config\n"
                 f"def get_config():\n  c = tiny_config({data_dir!r})\n  c.family = 'sps'\n  return c\n")
  assert launch.main([f"--config={cfg}", f"--workdir={workdir}", "--quiet"]) == 2
  errors = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(errors) == 1 and "config.family='sps' differs from the checkpoint" in errors[0], errors
  assert "('standard')" in errors[0], errors


def test_a_truncated_manifest_is_one_line_for_a_reader_and_for_restore_from(finished, tmp_path):
  """The resume path is covered in test_recovery; this is restore_params in a fresh process, where
  Python's own 'Exception ignored' tracebacks would reach stderr: a reader (--workdir) falls back
  with one warning, --restore_from refuses (an NslError: one line from the CLI) and prints nothing."""
  workdir = _copy(finished[1], tmp_path)
  open(os.path.join(workdir, "checkpoints", "6", "state", "manifest.ocdbt"), "r+b").truncate(10)
  code = ("import gc, sys; from nsl import checkpoint, runs; from nsl.errors import NslError\n"
          "from nsl.models import registry\n"
          f"c = runs.load_config({workdir!r}); a = runs.abstract_train_state(c, registry.get_family(c))\n"
          f"_, step = checkpoint.restore_params({workdir!r}, a, flag='--workdir'); gc.collect()\n"
          "print('step', step)\n"
          f"try:\n  checkpoint.restore_params({workdir!r}, a)\n"
          "except NslError as e:\n  print('refused', 'step 3 is intact' in str(e))\n"
          "gc.collect()\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, XLA_FLAGS=SUBPROCESS_XLA_FLAGS))
  assert proc.returncode == 0 and proc.stdout.split() == ["step", "3", "refused", "True"], proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("nsl: warning: --workdir: checkpoint") \
      and "checkpoints/6 is damaged" in lines[0] and "used step 3" in lines[0], lines


def test_reads_abandoned_by_a_failed_restore_print_nothing_and_other_errors_still_do():
  """Orbax's array reads beside one that failed stay suspended; closed at garbage collection, each
  turns its GeneratorExit into an Exception whose message is a whole TensorStore spec (issue #56:
  ~3,000 lines after the one error line). nsl.checkpoint's unraisable hook drops exactly those."""
  import gc

  from nsl import checkpoint

  class Suspend:
    def __await__(self):
      yield

  async def read():  # as orbax serialization._read_array_index_and_device_put
    try:
      await Suspend()
    except BaseException as e:
      raise Exception("Encountered error while reading array index: (). See full TensorStore details") from e

  class Broken:
    def __del__(self):
      raise ValueError("a real error at collection")

  seen, previous = [], sys.unraisablehook
  for hook in (checkpoint._drop_closed_loop_noise(previous=seen.append), seen.append):
    sys.unraisablehook = hook
    try:
      abandoned = read()
      abandoned.send(None)  # suspended at its await, as when the restore gave up
      del abandoned
      Broken()
      gc.collect()
    finally:
      sys.unraisablehook = previous
  kinds = [type(u.exc_value).__name__ for u in seen]
  assert kinds == ["ValueError", "Exception", "ValueError"], kinds  # the bare hook sees the read: the test can fail
