"""The pod and cluster scripts build the commands the README shows (dry run: nothing is started)."""

import os
import subprocess

from tests.helpers import ROOT


def _dry(script, *args, **env):
  out = subprocess.run(["bash", f"launch/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, NSL_DRY_RUN="1", **env), timeout=60)
  assert out.returncode == 0, out.stderr
  return out.stdout


def test_tpu_pod_runs_the_launcher_on_every_worker():
  out = _dry("tpu_pod.sh", "configs/sps.py:standard_xl", "/mnt/runs/xl", "--config.train.steps=10",
             TPU_NAME="pod", ZONE="us-east5-a")
  assert "tpu-vm ssh pod" in out and "--worker=all" in out and "--zone=us-east5-a" in out
  assert "nsl.launch" in out and "--distributed=auto" in out and "--config.train.steps=10" in out


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
