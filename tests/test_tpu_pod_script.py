"""launch/tpu_pod.sh against a stand-in `gcloud` (docs/guide/pods.md): `tpu-vm ssh --worker=all` runs
the command as N local processes, each worker with its own HOME (its disk) and the environment a
pod worker has (its worker number; here also the coordinator a CPU run needs), `tpu-vm scp
--worker=all` copies into every HOME. A real two-process `nsl.launch` of configs/tiny.py must run
from the shipped code (not the decoy ~/nsl), after the stale trainer left on a worker is stopped,
with one log per worker in WORKDIR/logs.
"""

import glob
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import time

import pytest

from tests.helpers import ROOT, SUBPROCESS_XLA_FLAGS, make_corpus

WORKERS = 2

GCLOUD = """#!{python}
import os, shutil, subprocess, sys
args = sys.argv[1:]
assert args[:3] == ["compute", "tpus", "tpu-vm"] and args[3] in ("scp", "ssh"), args
verb, rest = args[3], args[4:]
flags = dict(a[2:].split("=", 1) for a in rest if a.startswith("--") and "=" in a)
names = [a for a in rest if not a.startswith("--")]
assert flags.get("worker") == "all" and flags.get("zone"), rest
pod = os.environ["FAKE_POD"]
homes = sorted(os.path.join(pod, d) for d in os.listdir(pod) if d.startswith("worker"))
with open(os.path.join(pod, "calls.log"), "a") as f:
  f.write(verb + "\\n")
if verb == "scp":
  src, dest = names
  tpu, path = dest.split(":", 1)
  for home in homes:
    shutil.copy(src, os.path.join(home, path))
  sys.exit(0)
def env(i, home):
  e = {{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}}
  e.update(HOME=home, TPU_WORKER_ID=str(i), NSL_PROCESS_ID=str(i), NSL_NUM_PROCESSES=str(len(homes)),
           NSL_COORDINATOR_ADDRESS=os.environ["FAKE_POD_COORDINATOR"])
  return e
procs = [subprocess.Popen(["bash", "-c", flags["command"]], cwd=home, env=env(i, home)) for i, home in enumerate(homes)]
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
"""

DECOY = "open(__import__('os').path.expanduser('~/DECOY_RAN'), 'w').write('~/nsl ran')\nraise SystemExit(3)\n"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _stale_trainer(cwd: str) -> subprocess.Popen:
  """A process that looks like a trainer left running (`python -m nsl.launch ...`) from `cwd`."""
  os.makedirs(cwd, exist_ok=True)
  return subprocess.Popen(["bash", "-c", 'exec -a "python -m nsl.launch --config=stale" sleep 300'], cwd=cwd)


@pytest.fixture
def pod(tmp_path):
  pod = tmp_path / "pod"
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  gcloud = bin_dir / "gcloud"
  gcloud.write_text(GCLOUD.format(python=sys.executable))
  gcloud.chmod(gcloud.stat().st_mode | stat.S_IEXEC)
  for i in range(WORKERS):
    decoy = pod / f"worker{i}" / "nsl"  # what the old script ran: it must not run
    (decoy / "nsl").mkdir(parents=True)
    (decoy / "nsl" / "__init__.py").write_text(DECOY)
    (decoy / ".venv" / "bin").mkdir(parents=True)
    (decoy / ".venv" / "bin" / "python").write_text("#!/bin/sh\ntouch ~/DECOY_RAN\nexit 3\n")
    (decoy / ".venv" / "bin" / "python").chmod(0o755)
  return pod, bin_dir


def test_pod_script_ships_its_code_stops_a_stale_trainer_and_logs_per_worker(tmp_path, pod):
  pod_dir, bin_dir = pod
  data = make_corpus(str(tmp_path / "corpus"))
  workdir = tmp_path / "shared" / "run"  # WORKDIR on storage every worker mounts
  # No network here: the workers' environment borrows this venv's packages (not its editable nsl:
  # a .pth naming a directory adds it to sys.path without running the .pth files inside).
  site = sysconfig.get_paths()["purelib"]
  setup = (f"[ -x .venv/bin/python ] || ({sys._base_executable} -m venv --without-pip .venv && "
           f"echo {site} > .venv/lib/python3.{sys.version_info.minor}/site-packages/deps.pth)")
  stale = _stale_trainer(str(pod_dir / "worker1" / "nsl-code" / "0ld"))
  innocent = _stale_trainer(str(tmp_path / "elsewhere"))  # not started by the script: left alone
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_POD=str(pod_dir), TPU_NAME="pod",
             ZONE="us-east5-a", FAKE_POD_COORDINATOR=f"127.0.0.1:{_free_port()}", NSL_SETUP=setup,
             NSL_STALE_GRACE="5", JAX_PLATFORMS="cpu", XLA_FLAGS=SUBPROCESS_XLA_FLAGS)
  overrides = {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.d_ff": 96,
               "model.vocab_size": 257, "model.attention_chunk": 16, "data.path": data,
               "data.sources": repr((os.path.join(os.path.dirname(data), "text", "*.txt"),)),
               "data.tokenizer": "byte", "data.val_fraction": 0.2, "data.seq_len": 64, "train.batch_size": 8,
               "train.steps": 3, "train.warmup_steps": 1, "train.decay_steps": 1, "train.log_every": 1,
               "train.eval_every": 100, "train.eval_batches": 1, "checkpoint.every": 100,
               "checkpoint.async_save": "false"}
  tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  try:
    out = subprocess.run(["bash", os.path.join(ROOT, "launch", "tpu_pod.sh"), "configs/tiny.py", str(workdir),
                          *(f"--config.{k}={v}" for k, v in overrides.items())],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert stale.wait(timeout=10) == -signal.SIGTERM, "the stale trainer was left holding the TPU"
    assert innocent.poll() is None, "a process the script did not start was stopped"
  finally:
    for p in (stale, innocent):
      p.kill()
      p.wait()
  assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
  assert f"stopping stale TPU holder {stale.pid}" in out.stderr
  assert (pod_dir / "calls.log").read_text().split() == ["scp", "ssh", "ssh"]
  result = json.loads((workdir / "result.json").read_text())
  assert result["status"] == "done" and result["processes"] == 2 and result["steps"] == 3
  # the checkout's files as the script archived them (others may be edited meanwhile: this one is not)
  tracked = [f for f in tracked if os.path.isfile(os.path.join(ROOT, f))]
  assert "launch/tpu_pod.sh" in tracked and "nsl/launch.py" in tracked
  for i in range(WORKERS):
    home = pod_dir / f"worker{i}"
    assert not (home / "DECOY_RAN").exists(), "the worker ran ~/nsl"
    (code,) = glob.glob(str(home / "nsl-code" / "*" / ".nsl-unpacked"))
    code = os.path.dirname(code)
    assert [f for f in tracked if not os.path.exists(os.path.join(code, f))] == []
    # Python compiled the shipped nsl as it imported it: the trainer ran that code
    assert glob.glob(os.path.join(code, "nsl", "__pycache__", "launch.*.pyc"))
    log = (workdir / "logs" / f"worker{i}.log").read_text()
    assert f"worker{i} on " in log and "-m nsl.launch" in log and "--distributed=auto" in log
    assert not glob.glob(str(home / "nsl-code-*.tar.gz"))  # the archive is removed once unpacked
