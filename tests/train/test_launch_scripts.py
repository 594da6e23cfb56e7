"""The pod and cluster scripts build the commands the README shows (dry run: nothing is started)."""

import os
import subprocess

from tests.helpers import ROOT


def _dry(script, *args, **env):
  out = subprocess.run(["bash", f"launch/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, NSL_DRY_RUN="1", **env), timeout=60)
  assert out.returncode == 0, out.stderr
  return out.stdout


def _words(line):
  """The argv a dry run's `printf %q` line stands for (bash reads it back)."""
  out = subprocess.run(["bash", "-c", 'eval "set -- $1"; printf "%s\\0" "$@"', "_", line], capture_output=True,
                       text=True, check=True)
  return out.stdout.split("\0")[:-1]


def test_tpu_pod_runs_the_launcher_on_every_worker():
  out = _dry("tpu_pod.sh", "configs/sps.py:standard_xl", "/mnt/runs/xl", "--config.train.steps=10",
             TPU_NAME="pod", ZONE="us-east5-a")
  copy, ready, launch = map(_words, out.strip().splitlines())  # ship the code, prepare every worker, run
  assert copy[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in copy
  assert copy[6].startswith("pod:nsl-code-") and copy[6].endswith(".tar.gz")
  for cmd in (ready, launch):
    assert cmd[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod"]
    assert "--worker=all" in cmd and "--zone=us-east5-a" in cmd
  prepare, run = ready[-1], launch[-1]
  assert "uv venv -q --python 3.11 .venv" in prepare and "uv pip install -q --python .venv/bin/python -e" in prepare
  assert "lsof -t" in prepare and "kill -TERM" in prepare  # a stale TPU holder is stopped first
  assert '--name="worker$i" -- .venv/bin/python -m nsl.launch --config=configs/sps.py:standard_xl' in run
  assert "-m nsl.scaling.task --workdir=/mnt/runs/xl" in run and "--distributed=auto --config.train.steps=10" in run
  assert run.startswith('--command=set -euo pipefail; cd "$HOME/nsl-code/"') and "cd ~/nsl" not in out  # the shipped code


def test_tpu_pod_passes_a_checkout_config_relative_and_refuses_a_relative_workdir():
  out = _dry("tpu_pod.sh", os.path.join(ROOT, "configs", "tiny.py"), "gs://b/runs/t", TPU_NAME="pod", ZONE="z")
  assert "--config=configs/tiny.py" in _words(out.splitlines()[2])[-1]  # the workers' copy of the checkout
  bad = subprocess.run(["bash", "launch/tpu_pod.sh", "configs/tiny.py", "runs/t"], cwd=ROOT, capture_output=True,
                       text=True, env=dict(os.environ, NSL_DRY_RUN="1", TPU_NAME="pod", ZONE="z"), timeout=60)
  assert bad.returncode == 2 and "WORKDIR must be gs://" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_gpu_slurm_script_passes_the_process_layout():
  out = _dry("gpu_slurm.sh", "2", "configs/sps.py:standard_xl", "/shared/xl", GPUS_PER_NODE="4")
  assert "#SBATCH --nodes=2" in out and "#SBATCH --gpus-per-node=4" in out
  # the expanded commands each node runs are checked against a fake srun in tests/test_launch_slurm.py
  assert '--num_processes="$SLURM_NTASKS" --process_id="$SLURM_PROCID"' in out
  assert "--coordinator_address=" in out and "-m nsl.launch" in out
  assert "--config=" + str(ROOT) + "/configs/sps.py:standard_xl" in out


def test_scripts_reject_missing_arguments():
  for script in ("tpu_pod.sh", "gpu_slurm.sh", "local_multiprocess.sh"):
    out = subprocess.run(["bash", f"launch/{script}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage" in out.stderr


def test_scripts_reject_a_count_that_is_not_a_positive_integer():
  # Before launch/common.sh, local_multiprocess.sh started no process for N=0 and exited 0.
  for script, name in (("gpu_slurm.sh", "NODES"), ("local_multiprocess.sh", "N")):
    for count in ("0", "two", "-1"):
      out = subprocess.run(["bash", f"launch/{script}", count, "configs/tiny.py", "/tmp/never"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60, env=dict(os.environ, NSL_DRY_RUN="1"))
      assert out.returncode == 2, (script, count, out.stderr)
      assert out.stderr.strip() == f"launch/{script}: {name} must be a positive integer, got '{count}'"
