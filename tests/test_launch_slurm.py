"""launch/gpu_slurm.sh end to end without a cluster: the script is submitted to a fake `sbatch`
(which keeps the batch script), and that batch script then runs under a fake allocation of 3
nodes, with fake `scontrol` and `srun` first on PATH (srun records its arguments and
environment, then starts one task per node with that node's SLURM_PROCID) and a fake Python that
records what each node's `python -m nsl.launch` would receive. The test checks those command
lines: one per node, the first node as coordinator, process ids 0..2, every argument intact, and
that nsl.launch parses them into the config the user asked for."""

import json
import os
import stat
import subprocess

import pytest

from nsl import config as nsl_config
from nsl import launch as nsl_launch

from tests.helpers import ROOT

SCRIPT = os.path.join(ROOT, "launch", "gpu_slurm.sh")
NODES = ["gpu-a07", "gpu-a08", "gpu-b01"]


def _tool(path, body):
  with open(path, "w") as f:
    f.write("#!/usr/bin/env bash\n" + body)
  os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_cluster(tmp_path):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  record = tmp_path / "record"
  record.mkdir()
  _tool(bin_dir / "sbatch", f'cat > {record}/batch.sh\necho "Submitted batch job 4242"\n')
  # scontrol: one host per line, a pause after the first as a real lookup may take, so a reader
  # that stops after one line (head -n 1) makes the rest a SIGPIPE, which pipefail turns fatal.
  _tool(bin_dir / "scontrol", '[ "$1 $2" = "show hostnames" ] || exit 1\n'
                              f'[ "$3" = "gpu-a[07-08],gpu-b01" ] || exit 1\necho {NODES[0]}\nsleep 0.3\n'
                              f'printf "%s\\n" {" ".join(NODES[1:])}\n')
  # srun: record argv and environment, then run the command once per node as its task.
  _tool(bin_dir / "srun", f'''printf '%s\\0' "$@" > {record}/srun.argv
env > {record}/srun.env
while [ "${{1#--}}" != "$1" ]; do shift; done  # srun's own options
n=$SLURM_JOB_NUM_NODES
for i in $(seq 0 $((n - 1))); do
  SLURM_PROCID=$i SLURM_NODEID=$i SLURM_NTASKS=$n "$@" || exit $?
done
''')
  # The Python each task runs: record its argv, cwd and process id.
  _tool(bin_dir / "fake-python", f'''printf '%s\\0' "$@" > {record}/task$SLURM_PROCID.argv
pwd > {record}/task$SLURM_PROCID.cwd
''')
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", NSL_PYTHON=str(bin_dir / "fake-python"),
             GPUS_PER_NODE="4", PARTITION="h100", NSL_PORT="31337")
  env.pop("NSL_DRY_RUN", None)
  return env, record


def _argv(path):
  return path.read_bytes().decode().split("\0")[:-1]


def test_each_node_runs_nsl_launch_with_the_coordinator_and_its_process_id(fake_cluster, tmp_path):
  env, record = fake_cluster
  odd = "--config.model.attention_impl=cudnn"
  shape = "--config.mesh.shape=(1, -1, 1)"  # a space and parentheses: must arrive as one argument
  submit = subprocess.run(["bash", SCRIPT, "3", "configs/sps.py:sps_xs", "runs/xs gpu", odd, shape],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
  assert submit.returncode == 0, submit.stderr
  assert "Submitted batch job 4242" in submit.stdout
  batch = (record / "batch.sh").read_text()
  workdir = os.path.join(ROOT, "runs/xs gpu")
  assert os.path.isdir(workdir)  # made before sbatch, so slurm can write its output file there
  os.rmdir(workdir)
  for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
               "#SBATCH --partition=h100", f"#SBATCH --output={workdir}/slurm-%j.out"):
    assert line in batch.splitlines(), line

  job_env = dict(env, SLURM_JOB_NODELIST="gpu-a[07-08],gpu-b01", SLURM_JOB_NUM_NODES="3", SLURM_JOB_ID="4242")
  run = subprocess.run(["bash", str(record / "batch.sh")], cwd=str(tmp_path), env=job_env,
                       capture_output=True, text=True, timeout=60)
  assert run.returncode == 0, run.stderr
  srun = _argv(record / "srun.argv")
  assert srun[:2] == ["--ntasks-per-node=1", "bash"]
  assert "SLURM_JOB_NODELIST=gpu-a[07-08],gpu-b01" in (record / "srun.env").read_text().splitlines()

  config = os.path.join(ROOT, "configs/sps.py") + ":sps_xs"
  for pid in range(3):
    argv = _argv(record / f"task{pid}.argv")
    assert (record / f"task{pid}.cwd").read_text().strip() == ROOT
    assert argv == ["-m", "nsl.launch", f"--config={config}", f"--workdir={workdir}", odd, shape,
                    "--coordinator_address=gpu-a07:31337", "--num_processes=3", f"--process_id={pid}"]
    args, overrides = nsl_launch.parse_args(argv[2:])
    assert (args.coordinator_address, args.num_processes, args.process_id) == ("gpu-a07:31337", 3, pid)
    cfg = nsl_config.load_config(args.config, overrides)
    assert cfg.model.attention_impl == "cudnn" and tuple(cfg.mesh.shape) == (1, -1, 1)
    assert cfg.model.variant == "sps"


def test_dry_run_prints_the_script_and_bad_input_is_one_line(fake_cluster):
  env, record = fake_cluster
  dry = subprocess.run(["bash", SCRIPT, "2", "configs/tiny.py", "/tmp/nsl-slurm-dry"], cwd=ROOT,
                       env=dict(env, NSL_DRY_RUN="1"), capture_output=True, text=True, timeout=60)
  assert dry.returncode == 0 and "#SBATCH --nodes=2" in dry.stdout
  assert not (record / "batch.sh").exists() and not os.path.exists("/tmp/nsl-slurm-dry")
  for argv in (["2", "configs/tiny.py"], ["two", "configs/tiny.py", "/tmp/x"]):
    bad = subprocess.run(["bash", SCRIPT, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_a_gs_workdir_is_passed_on_as_written(fake_cluster, tmp_path):
  """A bucket workdir reaches every node's launcher untouched (it once became $PWD/gs:/...); no
  local directory is made for it, and sbatch's own output goes to the node's /tmp."""
  env, record = fake_cluster
  workdir = "gs://bucket/runs/tiny"
  dry = subprocess.run(["bash", SCRIPT, "2", "configs/tiny.py", workdir], cwd=str(tmp_path),
                       env=dict(env, NSL_DRY_RUN="1"), capture_output=True, text=True, timeout=60)
  assert dry.returncode == 0, dry.stderr
  assert f"--workdir={workdir}" in dry.stdout and "#SBATCH --output=/tmp/slurm-%j.out" in dry.stdout.splitlines()
  submit = subprocess.run(["bash", SCRIPT, "2", "configs/tiny.py", workdir], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=60)
  assert submit.returncode == 0, submit.stderr
  assert sorted(os.listdir(tmp_path)) == ["bin", "record"]  # no ./gs:/bucket/... made for it
  job_env = dict(env, SLURM_JOB_NODELIST="gpu-a[07-08],gpu-b01", SLURM_JOB_NUM_NODES="2", SLURM_JOB_ID="4243")
  run = subprocess.run(["bash", str(record / "batch.sh")], cwd=str(tmp_path), env=job_env, capture_output=True,
                       text=True, timeout=60)
  assert run.returncode == 0, run.stderr
  for pid in range(2):
    assert f"--workdir={workdir}" in _argv(record / f"task{pid}.argv")
