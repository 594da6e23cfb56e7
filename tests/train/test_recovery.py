"""Interrupted writes and concurrency: damaged checkpoints, partial records, kills between the
final writes, carried counters, the workdir lock, SIGTERM while compiling, a full disk."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax.numpy as jnp
import pytest

from nsl import launch
from nsl.errors import NslError
from nsl.models.transformer import StandardFamily
from nsl.train import loop
from tests.helpers import ROOT, make_corpus, tiny_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return make_corpus(str(tmp_path_factory.mktemp("corpus")), n=4, chars=3000)


@pytest.fixture(scope="module")
def finished(data_dir, tmp_path_factory):
  """A finished 6-step run with checkpoints at steps 3 and 6 (copied by each test)."""
  workdir = str(tmp_path_factory.mktemp("runs") / "base")
  loop.Trainer(tiny_config(data_dir), workdir, progress=False).run()
  return workdir


def _copy(finished, tmp_path, name="run"):
  dst = str(tmp_path / name)
  shutil.copytree(finished, dst)
  return dst


def _cfg_file(tmp_path, data_dir, overrides=None):
  """A config file for the CLI: tests.helpers.tiny_config on `data_dir` with `overrides`."""
  cfg = tmp_path / "cfg.py"
  cfg.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom tests.helpers import tiny_config\n"
                 f"def get_config():\n  return tiny_config({data_dir!r}, **{overrides or {}!r})\n")
  return cfg


def _train_steps(workdir):
  return [r["step"] for r in map(json.loads, open(os.path.join(workdir, "metrics.jsonl"))) if "loss" in r]


def _strict_json(path):
  def bad(x):
    raise ValueError(f"bare {x} in {path}")
  with open(path) as f:
    return json.load(f, parse_constant=bad)


def _largest_array_file(step_dir):
  return max(glob.glob(os.path.join(step_dir, "state", "ocdbt.process_0", "d", "*")), key=os.path.getsize)


@pytest.mark.parametrize("damage", ["array file", "_METADATA", "iterator state", "meta item",
                                    "truncated manifest.ocdbt", "empty step dir"])
def test_damaged_newest_checkpoint_falls_back_with_one_warning(data_dir, finished, tmp_path, capfd, damage):
  workdir = _copy(finished, tmp_path)
  step6 = os.path.join(workdir, "checkpoints", "6")
  {"array file": lambda: os.remove(_largest_array_file(step6)),
   "_METADATA": lambda: os.remove(os.path.join(step6, "state", "_METADATA")),
   "iterator state": lambda: os.remove(os.path.join(step6, "data", "process_0-of-1.json")),
   "meta item": lambda: os.remove(os.path.join(step6, "meta", "metadata")),
   "truncated manifest.ocdbt": lambda: open(os.path.join(step6, "state", "manifest.ocdbt"), "r+b").truncate(10),
   "empty step dir": lambda: (shutil.rmtree(step6), os.makedirs(step6))}[damage]()
  capfd.readouterr()
  result = loop.Trainer(tiny_config(data_dir, **{"train.steps": 8}), workdir, progress=False).run()
  warnings = [l for l in capfd.readouterr().err.splitlines() if l.startswith("nsl: warning")]
  assert len(warnings) == 1 and "checkpoints/6 is damaged" in warnings[0] and "step 3" in warnings[0], warnings
  assert result["status"] == "done" and result["steps"] == 8
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "6.damaged"))
  assert _train_steps(workdir) == list(range(1, 9))  # steps 4-6 replayed, logged once


def test_every_checkpoint_damaged_is_one_line_naming_the_directory(data_dir, finished, tmp_path, capsys):
  workdir = _copy(finished, tmp_path)
  for step in ("3", "6"):
    os.remove(os.path.join(workdir, "checkpoints", step, "state", "_METADATA"))
  cfg = _cfg_file(tmp_path, data_dir)
  assert launch.main([f"--config={cfg}", f"--workdir={workdir}", "--quiet"]) == 2
  errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("nsl: error")]
  assert len(errors) == 1 and f"every checkpoint in {workdir}/checkpoints is damaged" in errors[0], errors


def test_restore_from_a_damaged_run_uses_its_newest_complete_step(data_dir, finished, tmp_path, capfd):
  source = _copy(finished, tmp_path, "source")
  os.remove(_largest_array_file(os.path.join(source, "checkpoints", "6")))
  capfd.readouterr()
  from nsl import checkpoint
  trainer = loop.Trainer(tiny_config(data_dir), str(tmp_path / "new"), restore_from=source,
                         progress=False)
  _, step = checkpoint.restore_params(source, trainer.abstract_state)
  warnings = [l for l in capfd.readouterr().err.splitlines() if l.startswith("nsl: warning")]
  assert step == 3 and len(warnings) == 1 and "checkpoints/6 is damaged" in warnings[0], warnings


@pytest.mark.parametrize("override,field", [
    ({"model.window": 8}, "model.window"),
    ({"model.d_ff": 64}, "model.d_ff"),
    ({"model.vocab_size": 300}, "model.vocab_size"),
    ({"train.lr": 1e-2}, "train.lr"),
])
def test_resume_checks_every_field_that_fixes_the_model_or_data(data_dir, finished, tmp_path, override, field):
  workdir = _copy(finished, tmp_path)
  with pytest.raises(loop.ConfigError, match=f"config.{field}=.* differs from the checkpoint"):
    loop.Trainer(tiny_config(data_dir, **{"train.steps": 8, **override}), workdir, progress=False).run()


def test_resume_may_change_the_documented_fields(data_dir, finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  changed = {"train.steps": 7, "train.log_every": 2, "train.eval_every": 5, "checkpoint.every": 7,
             "checkpoint.keep": 2, "model.attention_chunk": 32, "model.remat": "full"}
  result = loop.Trainer(tiny_config(data_dir, **changed), workdir, progress=False).run()
  assert result["status"] == "done" and result["steps"] == 7


def test_partial_metrics_line_is_dropped_on_resume(data_dir, finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "6"))  # as if killed after step 6's log line
  os.remove(os.path.join(workdir, "result.json"))
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write('{"step": 7, "loss": 1.2')  # a write cut by the kill
  result = loop.Trainer(tiny_config(data_dir), workdir, progress=False).run()
  assert result["status"] == "done"
  assert _train_steps(workdir) == list(range(1, 7))
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    json.loads(line)


def test_kill_between_final_checkpoint_and_result_is_rewritten_from_the_state(data_dir, finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  before = json.load(open(os.path.join(workdir, "result.json")))
  os.remove(os.path.join(workdir, "result.json"))
  lines_before = open(os.path.join(workdir, "metrics.jsonl")).read()
  after = loop.Trainer(tiny_config(data_dir), workdir, progress=False).run()
  assert after["status"] == "done" and after["final_loss"] == before["final_loss"] is not None
  assert after["eval"] == before["eval"] and after["nonfinite_steps"] == before["nonfinite_steps"]
  assert _strict_json(os.path.join(workdir, "result.json"))["final_loss"] == before["final_loss"]
  assert open(os.path.join(workdir, "metrics.jsonl")).read() == lines_before  # nothing re-logged
  # A stale result.json (e.g. "preempted" from an earlier attempt) is rewritten too.
  json.dump({"status": "preempted", "final_loss": None}, open(os.path.join(workdir, "result.json"), "w"))
  again = loop.Trainer(tiny_config(data_dir), workdir, progress=False).run()
  assert _strict_json(os.path.join(workdir, "result.json"))["final_loss"] == before["final_loss"] == again["final_loss"]


def _poison(monkeypatch, steps):
  original = StandardFamily.loss

  def poisoned(self, params, batch, rng, step):
    loss, m = original(self, params, batch, rng, step)
    bad = jnp.zeros((), bool)
    for s in steps:
      bad = bad | (step == s)
    return jnp.where(bad, jnp.nan, loss), m

  monkeypatch.setattr(StandardFamily, "loss", poisoned)


def test_nonfinite_count_is_exact_and_carried_across_a_resume(data_dir, tmp_path, monkeypatch):
  config = tiny_config(data_dir, **{"train.steps": 8, "train.log_every": 3, "checkpoint.every": 100})
  _poison(monkeypatch, (1, 4, 6))  # optimizer steps 1, 4, 6 (0-based) are non-finite
  full = loop.Trainer(config, str(tmp_path / "full"), progress=False).run()
  assert full["nonfinite_steps"] == 3  # counted every step, not only on logged ones
  with monkeypatch.context() as m:
    m.setattr(loop._Preemption, "should_stop", lambda self, step: step == 5)
    first = loop.Trainer(config, str(tmp_path / "cut"), progress=False).run()
  assert first["status"] == "preempted" and first["nonfinite_steps"] == 2
  trainer = loop.Trainer(config, str(tmp_path / "cut"), progress=False)
  wall0, cpu0 = time.time(), time.process_time()
  resumed = trainer.run()
  own = {"wall_time_sec": time.time() - wall0, "cpu_time_sec": time.process_time() - cpu0}
  assert resumed["status"] == "done" and resumed["nonfinite_steps"] == 3
  # Wall and CPU seconds are carried too: the resumed record counts the first attempt's (up to its
  # checkpoint) on top of this attempt's own, which alone is at most what `run()` took here.
  for key, spent in own.items():
    assert first[key] > 0 and resumed[key] > spent


def test_nan_loss_writes_valid_json(data_dir, tmp_path, monkeypatch):
  _poison(monkeypatch, range(20))
  workdir = str(tmp_path / "run")
  result = loop.Trainer(tiny_config(data_dir, **{"train.steps": 5, "train.max_nonfinite": 100}), workdir,
                        progress=False).run()
  saved = _strict_json(os.path.join(workdir, "result.json"))
  assert result["nonfinite_steps"] == 5 and saved["final_loss"] is None and saved["nonfinite_steps"] == 5


def test_second_trainer_on_a_workdir_refuses_and_stale_locks_are_taken_over(data_dir, tmp_path, capsys):
  workdir = tmp_path / "run"
  workdir.mkdir()
  holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    from nsl.checkpoint import WorkdirLock
    from nsl.procs import proc_start
    lock = {"pid": holder.pid, "host": os.uname().nodename, "start": proc_start(holder.pid), "since": 0}
    (workdir / WorkdirLock.NAME).write_text(json.dumps(lock))
    cfg = _cfg_file(tmp_path, data_dir)
    assert launch.main([f"--config={cfg}", f"--workdir={workdir}", "--quiet"]) == 2
    errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("nsl: error")]
    assert len(errors) == 1 and f"in use by another trainer (pid {holder.pid}" in errors[0], errors
    assert not (workdir / "checkpoints").exists()
  finally:
    holder.kill()
    holder.wait()
  # The holder is gone: its lock is stale and the next trainer takes it over (and releases it).
  result = loop.Trainer(tiny_config(data_dir, **{"train.steps": 4}), str(workdir), progress=False).run()
  assert result["status"] == "done" and not (workdir / WorkdirLock.NAME).exists()


def test_sigterm_while_compiling_leaves_a_preempted_record(data_dir, tmp_path, monkeypatch):
  original = loop.prepare_data

  def terminated(config):
    os.kill(os.getpid(), signal.SIGTERM)  # arrives during construction (compile, data)
    return original(config)

  monkeypatch.setattr(loop, "prepare_data", terminated)
  workdir = str(tmp_path / "run")
  result = loop.Trainer(tiny_config(data_dir), workdir, progress=False).run()
  assert result["status"] == "preempted" and result["steps"] == 0
  assert _strict_json(os.path.join(workdir, "result.json"))["status"] == "preempted"
  monkeypatch.undo()
  assert loop.Trainer(tiny_config(data_dir), workdir, progress=False).run()["status"] == "done"


def test_disk_full_while_training_is_one_line(data_dir, tmp_path, capsys):
  if not os.path.exists("/dev/full"):
    pytest.skip("needs /dev/full")
  workdir = tmp_path / "run"
  workdir.mkdir()
  os.symlink("/dev/full", workdir / "metrics.jsonl")  # every write there: ENOSPC
  cfg = _cfg_file(tmp_path, data_dir)
  assert launch.main([f"--config={cfg}", f"--workdir={workdir}", "--quiet"]) == 2
  errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("nsl: error")]
  assert len(errors) == 1 and "disk full writing" in errors[0] and "bytes free" in errors[0], errors


def test_sigterm_right_after_start_through_the_cli_leaves_a_record(data_dir, tmp_path):
  import time
  from tests.helpers import SUBPROCESS_XLA_FLAGS
  cfg = _cfg_file(tmp_path, data_dir)
  workdir = tmp_path / "run"
  proc = subprocess.Popen([sys.executable, "-m", "nsl.launch", f"--config={cfg}", f"--workdir={workdir}", "--quiet"],
                          cwd=ROOT, env=dict(os.environ, XLA_FLAGS=SUBPROCESS_XLA_FLAGS),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  time.sleep(1.0)  # importing JAX, loading the config: before the trainer exists
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  assert _strict_json(workdir / "result.json")["status"] == "preempted"
  assert json.loads(out.strip().splitlines()[-1])["status"] == "preempted"


def test_disk_full_while_checkpointing_names_the_directory_and_bytes(data_dir, tmp_path, capsys, monkeypatch):
  import errno

  import orbax.checkpoint as ocp

  def full(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(ocp.CheckpointManager, "save", full)
  cfg = _cfg_file(tmp_path, data_dir)
  workdir = tmp_path / "run"
  assert launch.main([f"--config={cfg}", f"--workdir={workdir}", "--quiet"]) == 2
  errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("nsl: error")]
  assert len(errors) == 1 and f"disk full writing {workdir}/checkpoints" in errors[0], errors
  assert "bytes needed" in errors[0]
  assert json.load(open(workdir / "result.json"))["status"] == "failed"


def test_nll_eval_of_a_run_whose_checkpoints_are_all_damaged_is_one_line(finished, tmp_path, capsys):
  from nsl.evals import nll
  workdir = _copy(finished, tmp_path)
  for step in ("3", "6"):
    os.remove(_largest_array_file(os.path.join(workdir, "checkpoints", step)))
  assert nll.main([f"--workdir={workdir}"]) == 2
  errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("nsl: error")]
  assert len(errors) == 1 and f"--workdir={workdir!r}: every checkpoint in {workdir}/checkpoints is damaged" in errors[0], errors


def test_restore_from_another_architecture_is_one_line(data_dir, finished, tmp_path, capsys):
  cfg = _cfg_file(tmp_path, data_dir, {"model.d_ff": 64})
  assert launch.main([f"--config={cfg}", f"--workdir={tmp_path / 'new'}", f"--restore_from={finished}", "--quiet"]) == 2
  errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("nsl: error")]
  assert len(errors) == 1 and "does not match this model" in errors[0], errors
