"""Interrupted writes and concurrency: damaged checkpoints, partial records, kills between the
final writes, SIGKILL mid-training and during an asynchronous save, carried counters, the workdir
lock, SIGTERM while the train step compiles, a real full disk.

Runs use the default CPU kernels on one device, as a user's CPU run does (`tests/train/bitwise.py`),
and a resumed run must end in the same bits as an uninterrupted one: its state digest, metrics and
evaluation, not approximately (docs/guide/determinism.md).
"""

import glob
import json
import os
import random
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
from tests.helpers import ROOT, SUBPROCESS_XLA_FLAGS, make_corpus
from tests.train import bitwise, kills
from tests.train.bitwise import kernel_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return make_corpus(str(tmp_path_factory.mktemp("corpus")), n=4, chars=3000)


def _trainer(config, workdir, **kwargs):
  return loop.Trainer(config, str(workdir), progress=False, devices=bitwise.one_device(), **kwargs)


@pytest.fixture(scope="module")
def finished(data_dir, tmp_path_factory):
  """A finished 6-step run with checkpoints at steps 3 and 6 (copied by each test)."""
  workdir = str(tmp_path_factory.mktemp("runs") / "base")
  trainer = _trainer(kernel_config(data_dir), workdir)
  bitwise.assert_default_kernels(trainer.program)
  trainer.run()
  return workdir


@pytest.fixture(scope="module")
def uninterrupted_8(data_dir, tmp_path_factory):
  """The 8-step run that a resumed `finished` must equal bit for bit."""
  workdir = str(tmp_path_factory.mktemp("runs") / "eight")
  _trainer(kernel_config(data_dir, **{"train.steps": 8}), workdir).run()
  return workdir


def _copy(finished, tmp_path, name="run"):
  dst = str(tmp_path / name)
  shutil.copytree(finished, dst)
  return dst


def _cfg_file(tmp_path, data_dir, overrides=None):
  """A config file for the CLI: `bitwise.kernel_config` on `data_dir` with `overrides`."""
  cfg = tmp_path / "cfg.py"
  cfg.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom tests.train.bitwise import kernel_config\n"
                 f"def get_config():\n  return kernel_config({data_dir!r}, **{overrides or {}!r})\n")
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


def _drop_data_position(step_dir):
  """The checkpoint's metadata without its data position (docs/guide/training.md#elastic-resume)."""
  path = os.path.join(step_dir, "meta", "metadata")
  meta = json.load(open(path))
  del meta["data_state"]
  json.dump(meta, open(path, "w"))


def _flip_a_bit(path):
  """One bit of the middle byte of `path` flipped: an array's stored bytes change, its size does not."""
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)[0]
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize("damage", ["array file", "_METADATA", "iterator state", "meta item",
                                    "truncated manifest.ocdbt", "empty step dir", "flipped bit"])
def test_damaged_newest_checkpoint_falls_back_with_one_warning(data_dir, finished, uninterrupted_8, tmp_path, capfd,
                                                               damage):
  workdir = _copy(finished, tmp_path)
  step6 = os.path.join(workdir, "checkpoints", "6")
  {"array file": lambda: os.remove(_largest_array_file(step6)),
   "_METADATA": lambda: os.remove(os.path.join(step6, "state", "_METADATA")),
   "iterator state": lambda: _drop_data_position(step6),
   "meta item": lambda: os.remove(os.path.join(step6, "meta", "metadata")),
   "truncated manifest.ocdbt": lambda: open(os.path.join(step6, "state", "manifest.ocdbt"), "r+b").truncate(10),
   "empty step dir": lambda: (shutil.rmtree(step6), os.makedirs(step6)),
   "flipped bit": lambda: _flip_a_bit(_largest_array_file(step6))}[damage]()
  capfd.readouterr()
  result = _trainer(kernel_config(data_dir, **{"train.steps": 8}), workdir).run()
  warnings = [l for l in capfd.readouterr().err.splitlines() if l.startswith("nsl: warning")]
  assert len(warnings) == 1 and "checkpoints/6 is damaged" in warnings[0] and "step 3" in warnings[0], warnings
  if damage == "flipped bit":  # Orbax reads it as another number; the saved fingerprint tells (nsl.fingerprint)
    assert "differs from the fingerprint saved with it" in warnings[0], warnings
  assert result["status"] == "done" and result["steps"] == 8
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "6.damaged"))
  assert _train_steps(workdir) == list(range(1, 9))  # steps 4-6 replayed, logged once
  # Steps 1-3 of the 6-step run have the 8-step run's learning rates (warmup, then constant), so
  # the resumed run is the uninterrupted 8-step run, bit for bit.
  assert bitwise.result(workdir) == bitwise.result(uninterrupted_8)
  assert bitwise.metrics(workdir) == bitwise.metrics(uninterrupted_8)


def test_every_checkpoint_damaged_is_one_line_naming_the_directory(data_dir, finished, tmp_path, capsys):
  workdir = _copy(finished, tmp_path)
  for step in ("3", "6"):
    os.remove(os.path.join(workdir, "checkpoints", step, "state", "_METADATA"))
  cfg = _cfg_file(tmp_path, data_dir)
  assert launch.main([f"--config={cfg}", f"--workdir={workdir}", "--quiet"]) == 2
  errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("nsl: error")]
  assert len(errors) == 1 and f"every checkpoint in {workdir}/checkpoints is damaged" in errors[0], errors


def test_restore_from_a_damaged_run_is_one_line_and_a_reader_falls_back(data_dir, finished, tmp_path, capfd):
  """--restore_from a run whose newest step is damaged: one error naming it and the intact step
  (a new run must not start from weights other than the ones named); a reader of the run
  (`--workdir` of an evaluation) uses the newest intact step with one warning."""
  source = _copy(finished, tmp_path, "source")
  os.remove(_largest_array_file(os.path.join(source, "checkpoints", "6")))
  capfd.readouterr()
  from nsl import checkpoint
  from nsl.train import program
  abstract_state = program.Program(kernel_config(data_dir), bitwise.one_device()).abstract_state
  with pytest.raises(NslError, match=r"newest checkpoint .*checkpoints/6 is damaged .* step 3 is intact"):
    checkpoint.restore_params(source, abstract_state)
  assert not [l for l in capfd.readouterr().err.splitlines() if l.startswith("nsl: warning")]
  _, step = checkpoint.restore_params(source, abstract_state, flag="--workdir")
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
    _trainer(kernel_config(data_dir, **{"train.steps": 8, **override}), workdir).run()


def test_resume_may_change_the_documented_fields(data_dir, finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  changed = {"train.steps": 7, "train.log_every": 2, "train.eval_every": 5, "checkpoint.every": 7,
             "checkpoint.keep": 2, "model.attention_chunk": 32, "model.remat": "full"}
  result = _trainer(kernel_config(data_dir, **changed), workdir).run()
  assert result["status"] == "done" and result["steps"] == 7


def test_partial_metrics_line_is_dropped_on_resume(data_dir, finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "6"))  # as if killed after step 6's log line
  os.remove(os.path.join(workdir, "result.json"))
  with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
    f.write('{"step": 7, "loss": 1.2')  # a write cut by the kill
  result = _trainer(kernel_config(data_dir), workdir).run()
  assert result["status"] == "done"
  assert _train_steps(workdir) == list(range(1, 7))
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    json.loads(line)
  assert bitwise.metrics(workdir) == bitwise.metrics(finished)  # steps 4-6 replayed to the same bits
  assert bitwise.result(workdir) == bitwise.result(finished)


def test_kill_between_final_checkpoint_and_result_is_rewritten_from_the_state(data_dir, finished, tmp_path):
  workdir = _copy(finished, tmp_path)
  before = json.load(open(os.path.join(workdir, "result.json")))
  os.remove(os.path.join(workdir, "result.json"))
  lines_before = open(os.path.join(workdir, "metrics.jsonl")).read()
  after = _trainer(kernel_config(data_dir), workdir).run()
  assert after["status"] == "done" and after["final_loss"] == before["final_loss"] is not None
  assert after["eval"] == before["eval"] and after["nonfinite_steps"] == before["nonfinite_steps"]
  assert after["state_sha256"] == before["state_sha256"] is not None  # rewritten from the same bits
  assert _strict_json(os.path.join(workdir, "result.json"))["final_loss"] == before["final_loss"]
  assert open(os.path.join(workdir, "metrics.jsonl")).read() == lines_before  # nothing re-logged
  # A stale result.json (e.g. "preempted" from an earlier attempt) is rewritten too.
  json.dump({"status": "preempted", "final_loss": None}, open(os.path.join(workdir, "result.json"), "w"))
  again = _trainer(kernel_config(data_dir), workdir).run()
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
  config = kernel_config(data_dir, **{"train.steps": 8, "train.log_every": 3, "checkpoint.every": 100})
  _poison(monkeypatch, (1, 4, 6))  # optimizer steps 1, 4, 6 (0-based) are non-finite
  full = _trainer(config, tmp_path / "full").run()
  assert full["nonfinite_steps"] == 3  # counted every step, not only on logged ones
  with monkeypatch.context() as m:
    m.setattr(loop._Preemption, "poll", lambda self, step, save_due=False: (step == 5, save_due))
    first = _trainer(config, tmp_path / "cut").run()
  assert first["status"] == "preempted" and first["nonfinite_steps"] == 2
  trainer = _trainer(config, tmp_path / "cut")
  wall0, cpu0 = time.time(), time.process_time()
  resumed = trainer.run()
  own = {"wall_time_sec": time.time() - wall0, "cpu_time_sec": time.process_time() - cpu0}
  assert resumed["status"] == "done" and resumed["nonfinite_steps"] == 3
  assert resumed["state_sha256"] == full["state_sha256"]  # skipped steps replayed as skipped
  # Wall and CPU seconds are carried too: the resumed record counts the first attempt's (up to its
  # checkpoint) on top of this attempt's own, which alone is at most what `run()` took here.
  for key, spent in own.items():
    assert first[key] > 0 and resumed[key] > spent


def test_nan_loss_writes_valid_json(data_dir, tmp_path, monkeypatch):
  _poison(monkeypatch, range(20))
  workdir = str(tmp_path / "run")
  result = _trainer(kernel_config(data_dir, **{"train.steps": 5, "train.max_nonfinite": 100}), workdir).run()
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
  result = _trainer(kernel_config(data_dir, **{"train.steps": 4}), workdir).run()
  assert result["status"] == "done" and not (workdir / WorkdirLock.NAME).exists()


def test_sigterm_while_compiling_the_train_step_stops_after_that_step(data_dir, finished, tmp_path, monkeypatch):
  """SIGTERM arrives inside JAX's compile of the train step (the module named train_step): the step
  under way finishes, the run stops there with a checkpoint and a "preempted" record, and the same
  command again finishes with the bits of the uninterrupted run."""
  from jax._src import compiler
  original, signalled = compiler.compile_or_get_cached, []

  def compile_under_sigterm(backend, computation, *args, **kwargs):
    name = str(computation.operation.attributes["sym_name"])
    if "train_step" in name and not signalled:
      signalled.append(name)
      os.kill(os.getpid(), signal.SIGTERM)
    return original(backend, computation, *args, **kwargs)

  monkeypatch.setattr(compiler, "compile_or_get_cached", compile_under_sigterm)
  workdir = str(tmp_path / "run")
  result = _trainer(kernel_config(data_dir), workdir).run()
  assert signalled, "the train step was not compiled: no SIGTERM was sent"
  assert result["status"] == "preempted" and result["steps"] == 1, result
  assert _strict_json(os.path.join(workdir, "result.json"))["status"] == "preempted"
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "1"))
  monkeypatch.undo()
  assert _trainer(kernel_config(data_dir), workdir).run()["status"] == "done"
  assert bitwise.result(workdir) == bitwise.result(finished)


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


def _small_disk(tmp_path, size="1m"):
  """The command prefix that runs `sh -c SCRIPT DIR ...` with a `size` tmpfs mounted on DIR, in a
  mount namespace of its own (nothing to unmount, however the test ends): root's `unshare -m`,
  or an unprivileged user namespace's `unshare -rm`. Skips, saying why, where neither can mount."""
  import shutil as sh
  if not sh.which("unshare"):
    pytest.skip("host fact: no unshare(1) to mount a size-limited tmpfs")
  prefix = ["unshare", "-m" if os.geteuid() == 0 else "-rm", "sh", "-c"]
  probe = subprocess.run(prefix + [f'mount -t tmpfs -o size={size} tmpfs "$0"', str(tmp_path)],
                         capture_output=True, text=True)
  if probe.returncode != 0:
    pytest.skip(f"host fact: cannot mount a tmpfs here, as root or in a user namespace ({probe.stderr.strip()[:200]})")
  return prefix


def test_a_real_full_disk_during_an_async_save_is_one_line(data_dir, tmp_path):
  """The workdir's checkpoints directory on a 1 MiB tmpfs (the records beside it on the test's
  disk, so only a checkpoint's write can fail): the first checkpoint (~2.5 MB) does not fit. The
  asynchronous save returns at once and fails later, in Orbax's background commit (whose threads
  log ~300 lines of tracebacks); the user sees one line naming the checkpoints directory, the
  bytes free and needed, exit 2, and result.json says failed."""
  prefix = _small_disk(tmp_path)
  cfg = _cfg_file(tmp_path, data_dir, {"checkpoint.async_save": True})
  workdir, listing = tmp_path / "run", tmp_path / "checkpoints.txt"
  (workdir / "checkpoints").mkdir(parents=True)
  script = 'mount -t tmpfs -o size=1m tmpfs "$0" && "$@"; rc=$?; ls -a "$0" > ' f'"{listing}"; exit $rc'
  proc = subprocess.run(prefix + [script, str(workdir / "checkpoints"), sys.executable, "-m", "nsl.launch",
                                  f"--config={cfg}", f"--workdir={workdir}", "--quiet"], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, XLA_FLAGS=SUBPROCESS_XLA_FLAGS))
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
  assert lines[0].startswith(f"nsl: error: disk full writing {workdir}/checkpoints (") \
      and "bytes free" in lines[0] and "bytes needed" in lines[0], lines
  assert _strict_json(workdir / "result.json")["status"] == "failed"
  assert max(_train_steps(workdir)) > 3  # it trained on past the save of step 3: the fault came later
  assert not [n for n in listing.read_text().split() if n.isdigit()]  # no step was finished


def test_nll_eval_of_a_run_whose_checkpoints_are_all_damaged_is_one_line(finished, tmp_path, capsys):
  from nsl.evals import nll
  workdir = _copy(finished, tmp_path)
  for step in ("3", "6"):
    os.remove(_largest_array_file(os.path.join(workdir, "checkpoints", step)))
  assert nll.main([f"--workdir={workdir}"]) == 2
  errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("nsl: error")]
  assert len(errors) == 1 and f"--workdir={workdir!r}: every checkpoint in {workdir}/checkpoints is damaged" in errors[0], errors


def _launch(cfg, workdir):
  """The CLI on one CPU device, as a user starts it, in its own process group (to SIGKILL)."""
  return subprocess.Popen([sys.executable, "-m", "nsl.launch", f"--config={cfg}", f"--workdir={workdir}", "--quiet"],
                          cwd=ROOT, env=dict(os.environ, XLA_FLAGS=SUBPROCESS_XLA_FLAGS),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_when(proc, ready, what, timeout=300):
  """SIGKILLs proc's group the moment `ready()` holds; fails if proc ends first."""
  deadline = time.time() + timeout
  while not ready():
    assert proc.poll() is None, f"the run ended before {what}: {proc.stdout.read().decode()[-3000:]}"
    assert time.time() < deadline, f"no {what} within {timeout} s"
    time.sleep(0.005)
  kills.kill_group(proc)


@pytest.mark.slow
def test_sigkill_mid_training_and_during_an_async_save_resumes_to_the_same_bits(data_dir, tmp_path):
  """Killed at a random step, restarted, killed again while an asynchronous save is being written
  (proven after the kill: tests/train/kills.py), restarted to the end: the final state, metrics
  and evaluation equal an uninterrupted run's."""
  overrides = {"train.steps": 10, "checkpoint.every": 2, "checkpoint.async_save": True, "train.eval_every": 5}
  cfg = _cfg_file(tmp_path, data_dir, overrides)
  reference = tmp_path / "reference"
  proc = _launch(cfg, reference)
  assert proc.wait(timeout=600) == 0, proc.stdout.read().decode()[-3000:]

  run, step = tmp_path / "killed", random.Random(os.getpid()).randint(1, 7)
  metrics = run / "metrics.jsonl"
  logged = lambda: metrics.exists() and f'"step": {step},' in metrics.read_text()  # a train line
  _kill_when(_launch(cfg, run), logged, f"step {step}")
  unfinished, finalized = kills.local_saves(run / "checkpoints")
  cut = kills.kill_during_save(lambda: _launch(cfg, run), unfinished, finalized)
  assert (run / "checkpoints" / cut).is_dir() and not (run / "checkpoints" / cut.split(".")[0]).exists()
  proc = _launch(cfg, run)
  out = proc.communicate(timeout=600)[0].decode()
  assert proc.returncode == 0, out[-3000:]
  assert bitwise.result(run)["status"] == "done"
  assert bitwise.result(run) == bitwise.result(reference), f"killed at step {step}, then during the save {cut}"
  assert bitwise.metrics(run) == bitwise.metrics(reference)
