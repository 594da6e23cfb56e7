"""Runs and data in a GCS bucket (docs/guide/storage.md), against fake-gcs-server on 127.0.0.1
(tests/storage/emulator.py): one emulator for the module, pointed at by STORAGE_EMULATOR_HOST
alone, as a user would. The trainer runs as the CLI in subprocesses, SIGKILLed during an
asynchronous save in the bucket (proven mid-save after the kill), and must end in the bits of an uninterrupted local run."""

import json
import os
import subprocess
import sys

import pytest

from nsl import checkpoint, launch, procs, report, storage
from nsl.evals import nll
from nsl.errors import NslError
from tests.helpers import ROOT, SUBPROCESS_XLA_FLAGS, make_corpus
from tests.train import bitwise, kills

OVERRIDES = {"train.steps": 6, "checkpoint.every": 2, "checkpoint.async_save": True, "train.eval_every": 3}


@pytest.fixture(scope="module")
def data(gcs, tmp_path_factory):
  """(local data dir, its copy in the bucket)."""
  local = make_corpus(str(tmp_path_factory.mktemp("corpus")), n=4, chars=3000)
  for name in os.listdir(local):
    storage.upload(os.path.join(local, name), f"gs://bucket/data/{name}")
  return local, "gs://bucket/data"


def _cfg(tmp_path, data_dir, name="cfg.py"):
  cfg = tmp_path / name
  cfg.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom tests.train.bitwise import kernel_config\n"
                 f"def get_config():\n  return kernel_config({data_dir!r}, **{OVERRIDES!r})\n")
  return str(cfg)


def _launch(cfg, workdir):
  return subprocess.Popen([sys.executable, "-m", "nsl.launch", f"--config={cfg}", f"--workdir={workdir}", "--quiet"],
                          cwd=ROOT, env=dict(os.environ, XLA_FLAGS=SUBPROCESS_XLA_FLAGS),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _records(workdir, name):
  return [json.loads(line) for line in storage.read_text(f"{workdir}/{name}").splitlines()] if name.endswith("l") \
      else json.loads(storage.read_text(f"{workdir}/{name}"))


def test_gs_run_killed_during_an_async_save_resumes_to_the_bits_of_a_local_run(gcs, data, tmp_path):
  local_data, gs_data = data
  reference = tmp_path / "reference"  # trained meanwhile: the two overlap their start-up
  ref = _launch(_cfg(tmp_path, local_data, "local.py"), reference)
  cfg, run = _cfg(tmp_path, gs_data), "gs://bucket/runs/killed"
  # Killed while a step is written in the bucket, and proven so after the kill (tests/train/kills.py):
  # the step is still there without its commit_success.txt.
  unfinished, finalized = kills.bucket_saves(f"{run}/checkpoints")
  cut = kills.kill_during_save(lambda: _launch(cfg, run), unfinished, finalized)
  assert storage.isdir(f"{run}/checkpoints/{cut}") and not finalized(cut)
  assert storage.isfile(f"{run}/.nsl.lock")  # left by the killed trainer: stale, taken over below

  proc = _launch(cfg, run)
  out = proc.communicate(timeout=600)[0].decode()
  assert proc.returncode == 0, out[-3000:]
  assert ref.wait(timeout=600) == 0, ref.stdout.read().decode()[-3000:]
  assert "warning" not in out, out  # a cut-short save is not damage
  result = _records(run, "result.json")
  assert result["status"] == "done" and result["state_sha256"] == bitwise.result(reference)["state_sha256"]
  strip = lambda rows: [{k: v for k, v in r.items() if k not in bitwise.TIMING} for r in rows]
  assert strip(_records(run, "metrics.jsonl")) == bitwise.metrics(reference)
  names = storage.listdir(run)
  assert {"checkpoints", "config.json", "metrics.jsonl", "result.json", "tb"} <= set(names), names
  assert ".nsl.lock" not in names
  assert json.loads(storage.read_text(f"{run}/config.json"))["data"]["path"] == gs_data
  # The data was read from the bucket: the run's copy of it is in the cache, shard for shard.
  cached = storage.cache_dir("data", gs_data)
  assert sorted(os.listdir(cached)) == sorted(os.listdir(local_data))
  # nsl.report reads the records from the bucket and puts the loss curve beside them.
  assert report.main([run]) == 0 and storage.isfile(f"{run}/loss_curve.png")
  assert launch.check_remote_workdir(run) == run  # still a run to rerun, with the report's picture in it
  # An evaluation reads the run from the bucket and merges its figures into the bucket's result.json.
  assert nll.main([f"--workdir={run}", "--max_batches=1"]) == 0
  merged = _records(run, "result.json")
  assert merged["state_sha256"] == result["state_sha256"] and "val" in merged["eval_details"], merged


def test_lock_in_a_bucket_refuses_a_live_holder_and_takes_over_a_dead_ones(gcs):
  workdir = "gs://bucket/runs/locked"
  holder = {"pid": os.getppid(), "host": os.uname().nodename, "start": procs.proc_start(os.getppid())}
  storage.write_text(f"{workdir}/.nsl.lock", json.dumps(holder))
  with pytest.raises(NslError, match=f"in use by another trainer \\(pid {os.getppid()}"):
    checkpoint.WorkdirLock.acquire(workdir)
  storage.write_text(f"{workdir}/.nsl.lock", json.dumps(dict(holder, pid=2 ** 22 + 17, start=1)))
  lock = checkpoint.WorkdirLock.acquire(workdir)
  assert json.loads(storage.read_text(f"{workdir}/.nsl.lock"))["pid"] == os.getpid()
  assert not storage.create_exclusive(f"{workdir}/.nsl.lock", "{}")  # GCS's create-only write
  lock.release()
  assert not storage.exists(f"{workdir}/.nsl.lock")


def _errors(capsys):
  return [l for l in capsys.readouterr().err.splitlines() if l.strip()]


@pytest.mark.parametrize("case", ["missing bucket", "foreign workdir", "missing data", "missing shard",
                                  "missing restore_from"])
def test_bad_bucket_input_is_one_line_and_writes_nothing(gcs, data, tmp_path, capsys, case):
  local_data, gs_data = data
  workdir, data_dir, args = "gs://bucket/runs/bad", gs_data, []
  if case == "missing bucket":
    workdir = "gs://no-such-bucket/run"
  elif case == "foreign workdir":
    workdir = "gs://bucket/theirs"
    storage.write_text(f"{workdir}/notes.txt", "not a run")
  elif case == "missing data":
    data_dir = "gs://bucket/no-data"
  elif case == "missing restore_from":
    args = ["--restore_from=gs://bucket/no-run"]
  else:
    data_dir = "gs://bucket/broken-data"
    for name in os.listdir(local_data):
      if not name.startswith("val_"):
        storage.upload(os.path.join(local_data, name), f"{data_dir}/{name}")
  before = storage.listdir("gs://bucket/runs/bad") + storage.listdir("gs://bucket/theirs")
  capsys.readouterr()
  assert launch.main([f"--config={_cfg(tmp_path, data_dir)}", f"--workdir={workdir}", "--quiet", *args]) == 2
  errors = _errors(capsys)
  assert len(errors) == 1 and errors[0].startswith("nsl: error"), errors
  expect = {"missing bucket": "bucket gs://no-such-bucket does not exist",
            "foreign workdir": "holds objects nsl did not write (notes.txt)",
            "missing data": "data dir gs://bucket/no-data does not exist",
            "missing shard": "lists val_00000.bin, which is not there",
            "missing restore_from": "no checkpoints directory at gs://bucket/no-run/checkpoints"}[case]
  assert expect in errors[0], errors
  assert storage.listdir("gs://bucket/runs/bad") + storage.listdir("gs://bucket/theirs") == before


def test_a_missing_grid_root_in_a_bucket_is_one_line(gcs, capsys):
  from nsl.scaling import grid
  assert grid.main(["status", "--root=gs://bucket/no-grid-here"]) == 2
  errors = _errors(capsys)
  assert len(errors) == 1 and "no grid there" in errors[0], errors
  assert grid.main(["status", "--root=gs://no-such-bucket/grid"]) == 2
  errors = _errors(capsys)
  assert len(errors) == 1 and "bucket gs://no-such-bucket does not exist" in errors[0], errors


def test_prepare_with_the_tokenizer_of_a_data_dir_in_a_bucket(gcs, data, tmp_path):
  from nsl.data import prepare
  local_data, gs_data = data
  (tmp_path / "t.txt").write_text("Four score and seven years ago. " * 40)
  out = str(tmp_path / "out")
  manifest = prepare.prepare(out, [str(tmp_path / "t.txt")], tokenizer_from=gs_data)
  assert manifest["tokenizer_from"] == gs_data and manifest["tokenizer"] == prepare.load_manifest(local_data)["tokenizer"]
  with pytest.raises(NslError, match="--tokenizer_from: data dir gs://bucket/none does not exist"):
    prepare.prepare(str(tmp_path / "out2"), [str(tmp_path / "t.txt")], tokenizer_from="gs://bucket/none")
