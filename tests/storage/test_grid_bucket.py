"""A grid whose only shared place is a bucket (docs/guide/pods.md): the root on the GCS emulator,
the runner and each cell process in their own working directory and HOME, the data prepared once
into the root; status, fit and plot read it from yet another directory."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from nsl import lease, storage
from nsl.scaling import cells as cell_files
from nsl.scaling.locks import CellLock
from tests.helpers import ROOT, SUBPROCESS_XLA_FLAGS, sotu_texts

GRID_ROOT = "gs://bucket/grid"


def _grid(tmp_path, text_glob: str) -> str:
  path = tmp_path / "bucket_grid.py"
  path.write_text(textwrap.dedent(f"""
      def get_grid():
        return {{"base": "configs/tiny.py",
                "overrides": {{"data.path": "data/bucket-grid-bytes", "data.sources": ({text_glob!r},),
                              "data.tokenizer": "byte", "data.val_fraction": 0.2, "model.vocab_size": 257,
                              "model.d_model": 32, "model.n_layers": 2, "model.n_heads": 2, "model.d_ff": 96,
                              "data.seq_len": 64, "train.batch_size": 8, "train.warmup_steps": 1,
                              "train.decay_steps": 1, "train.log_every": 1, "train.eval_every": 100,
                              "train.eval_batches": 1, "checkpoint.every": 2, "checkpoint.async_save": False,
                              "model.cpu_kernels": False}},  # an empty HOME has no built kernels
                "axes": {{"train.steps": [3, 4]}}}}
  """))
  return str(path)


def _env(gcs, home) -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith(("NSL_", "TENSORSTORE_", "GOOGLE_AUTH"))}
  home.mkdir(parents=True, exist_ok=True)
  return dict(env, **gcs.env(), HOME=str(home), XLA_FLAGS=SUBPROCESS_XLA_FLAGS, NSL_CACHE_DIR=str(home / "cache"),
              PYTHONPATH=ROOT)


def test_a_grid_rooted_in_a_bucket_shares_nothing_else(gcs, tmp_path):
  texts = tmp_path / "texts"
  texts.mkdir()
  for i, text in enumerate(sotu_texts(8, 4000)):
    (texts / f"{i:02d}.txt").write_text(text)
  grid_file = _grid(tmp_path, str(texts / "*.txt"))
  runner_dir = tmp_path / "runner"
  runner_dir.mkdir()
  cmd = [sys.executable, "-m", "nsl.scaling.grid", "run", f"--grid={grid_file}", f"--root={GRID_ROOT}",
         "--local_isolate", "--poll_seconds=0.2", "--retries=0"]
  out = subprocess.run(cmd, cwd=runner_dir, env=_env(gcs, tmp_path / "home-runner"), capture_output=True, text=True,
                       timeout=240)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "preparing data/bucket-grid-bytes once for the grid at gs://bucket/grid/data/bucket-grid-bytes" in out.stdout
  assert not (runner_dir / "data").exists()  # nothing written beside the runner: the data is in the bucket
  assert storage.isfile(f"{GRID_ROOT}/data/bucket-grid-bytes/manifest.json")

  ids = [n for n in storage.listdir(GRID_ROOT) if storage.isfile(f"{GRID_ROOT}/{n}/cell.json")]
  assert len(ids) == 2
  for run_id in ids:
    d = f"{GRID_ROOT}/{run_id}"
    result = json.loads(storage.read_text(f"{d}/result.json"))
    assert result["status"] == "done" and result["steps"] == int(run_id.split("-")[0][5:])
    status = json.loads(storage.read_text(f"{d}/status.json"))
    assert f"--config.data.path={GRID_ROOT}/data/bucket-grid-bytes" in status["command"]  # placed, not hashed
    assert status["command"][0] == "--config=configs/tiny.py"  # relative to the code the cell ran
    assert "nsl.launch" in storage.read_text(f"{d}/logs/local.log")  # the worker's log, in the bucket
    assert not storage.exists(f"{d}/{cell_files.LOCK_FILE}") and not storage.exists(f"{d}/.nsl.lock")

  reader = tmp_path / "reader"
  reader.mkdir()
  env = _env(gcs, tmp_path / "home-reader")
  for args in (["nsl.scaling.grid", "status", f"--root={GRID_ROOT}"],
               ["nsl.scaling.fit", f"--root={GRID_ROOT}", "--bootstrap=0"],
               ["nsl.scaling.plot", f"--root={GRID_ROOT}"]):
    out = subprocess.run([sys.executable, "-m", *args], cwd=reader, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, (args, out.stdout + out.stderr)
    if args[0] == "nsl.scaling.grid":
      assert out.stdout.count(" done") == 2, out.stdout
  assert json.loads(storage.read_text(f"{GRID_ROOT}/fits.json"))["input"]["kind"] == "grid"
  assert storage.isfile(f"{GRID_ROOT}/plots/loss_vs_tokens.png")
  assert sorted(os.listdir(reader)) == []  # the readers wrote nothing where they ran


def test_claims_in_a_bucket_are_create_only_and_lapse(gcs, monkeypatch):
  path = f"{GRID_ROOT}-claims/cell/{cell_files.LOCK_FILE}"
  claim = CellLock.acquire(path, seconds=30)
  assert claim is not None and CellLock.acquire(path) is None and CellLock.held(path)
  assert not storage.create_exclusive(path, "{}")  # GCS's ifGenerationMatch=0
  assert claim.heartbeat()
  claim.release()
  assert not storage.exists(path)
  # another host's claim: live until its lease lapses, then anyone takes it over
  other = {"pid": 1, "host": "worker-elsewhere", "start": "1", "since": 0.0, "expires": 4e9}
  storage.write_text(path, json.dumps(other))
  assert CellLock.held(path) and CellLock.acquire(path) is None
  storage.write_text(path, json.dumps(dict(other, expires=1.0)))
  assert not CellLock.held(path)
  taken = CellLock.acquire(path)
  assert taken is not None and lease.read(path)[0]["host"] == os.uname().nodename
  # the old holder comes back: its renewal fails, so it stops using the cell
  stale = lease.Lease(path, dict(other, expires=1.0), 30)
  assert not stale.renew(force=True)
  taken.release()


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_a_run_lock_left_on_another_host_is_taken_over_once_its_lease_lapses(gcs, tmp_path, where, capsys):
  from nsl.checkpoint import WorkdirLock

  workdir = str(tmp_path / "run") if where == "local" else f"{GRID_ROOT}-locks/run"
  storage.makedirs(workdir)
  path = storage.join(workdir, WorkdirLock.NAME)
  import time
  storage.write_text(path, json.dumps({"pid": 1, "host": "requeued-from", "start": "1", "since": 0.0,
                                       "expires": time.time() + 2}))
  t0 = time.time()
  lock = WorkdirLock.acquire(workdir, seconds=30)
  waited = time.time() - t0
  try:
    assert 1.0 < waited < 10, waited  # waited for the lapse, no longer
    assert "waiting" in capsys.readouterr().err
    assert lease.read(path)[0]["pid"] == os.getpid()
  finally:
    lock.release()
  assert not storage.exists(path)
