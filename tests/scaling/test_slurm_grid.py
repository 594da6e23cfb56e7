"""`python -m nsl.scaling.grid run --backend=slurm` against a real one-node Slurm
(tests/cluster/slurm.py: slurmctld + slurmd + munged on this host) and, for the grid's root, the
GCS emulator (tests/storage/emulator.py): docs/guide/pods.md#slurm, issue #53.

  - a tiny grid (one cell of one process, one of two Slurm tasks joined by jax.distributed) runs
    to done with its root in the bucket, the cells' code shipped through it, and `grid status`
    finds every record;
  - that one-process cell, requeued by Slurm mid-run (`scontrol requeue`), stays one attempt of
    the runner's and finishes from the checkpoint its SIGTERM saved, to the state digest of the
    uninterrupted run;
  - SIGTERM to the runner cancels its jobs (after their tasks checkpoint) and leaves its cells
    pending;
  - a held job (JobHeldUser here, an admin's JobHeldAdmin alike) waits for its release: the runner
    says so once, `grid status` shows it, and the cell runs once released.
"""

import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest

from nsl import storage
from nsl.scaling import slurm as slurm_backend
from tests.cluster.slurm import slurm  # noqa: F401 (the session's Slurm fixture)
from tests.helpers import ROOT, SUBPROCESS_XLA_FLAGS
from tests.storage.emulator import bucket_env

pytestmark = pytest.mark.slow  # end to end: training runs under a real Slurm, tens of seconds each

STEPS = 40  # the requeued cell's; its checkpoints every 5 steps
OVERRIDES = {
    "data.path": "data/sotu-byte", "data.sources": ("sotu",), "data.tokenizer": "byte", "model.vocab_size": 257,
    "model.n_layers": 2, "model.d_model": 32, "model.n_heads": 2, "model.d_ff": 96, "model.attention_chunk": 64,
    "data.seq_len": 64, "train.batch_size": 16, "train.lr": 3e-3, "train.warmup_steps": 4, "train.decay_steps": 8,
    "train.log_every": 5, "train.eval_every": 1_000_000, "train.eval_batches": 2, "checkpoint.every": 5,
    "checkpoint.async_save": False,
}


def grid_file(tmp_path, name: str, cells: list[dict]) -> str:
  """A grid of configs/tiny.py cells, each a dict of its own axis values (steps, hosts)."""
  path = tmp_path / f"{name}.py"
  grids = [{"base": "configs/tiny.py", "overrides": OVERRIDES, "axes": {k: [v] for k, v in cell.items()}}
           for cell in cells]
  path.write_text(f"def get_grid():\n  return {grids!r}\n")
  return str(path)


def grid(*args: str, env: dict | None = None, popen: bool = False, timeout: float = 170):
  argv = [sys.executable, "-m", "nsl.scaling.grid", *args]
  full_env = dict(os.environ, XLA_FLAGS=SUBPROCESS_XLA_FLAGS, **(env or {}))
  if popen:
    return subprocess.Popen(argv, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  return subprocess.run(argv, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)


def run_slurm(grid_path: str, root: str, *extra: str, **kw):
  return grid("run", f"--grid={grid_path}", f"--root={root}", "--backend=slurm", "--poll_seconds=0.5", *extra, **kw)


def read(path: str) -> dict:
  return json.loads(storage.read_text(path))


def wait_for(what, timeout: float, every: float = 0.2, proc=None):
  deadline = time.time() + timeout
  while time.time() < deadline:
    found = what()
    if found:
      return found
    if proc is not None and proc.poll() is not None:
      pytest.fail(f"the runner exited early ({proc.returncode}): {proc.stdout.read()[-3000:]}")
    time.sleep(every)
  pytest.fail(f"timed out after {timeout:.0f} s waiting for {what.__doc__ or what}")


def squeue() -> list[str]:
  return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30).stdout.split()


def trainer_pids(workdir: str) -> list[int]:
  """The `python -m nsl.launch` processes training in `workdir` (children of the Slurm tasks)."""
  pids = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
    except OSError:
      continue
    if argv[1:3] == ["-m", "nsl.launch"] and f"--workdir={workdir}" in argv:
      pids.append(int(pid))
  return pids


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
  """The emulator with a bucket `bucket`; this process's environment points at it meanwhile."""
  with bucket_env(str(tmp_path_factory.mktemp("cache"))) as emu:
    yield emu


@pytest.fixture(scope="module")
def finished_grid(slurm, bucket, tmp_path_factory):
  """The two-cell grid run to the end with its root in the bucket: (root, cells by hosts)."""
  cells = [{"train.steps": STEPS}, {"train.steps": 15, "hosts": 2}]
  path = grid_file(tmp_path_factory.mktemp("grid"), "tiny_slurm", cells)
  root = "gs://bucket/slurm_grid"
  t0 = time.time()
  proc = run_slurm(path, root, "--parallel=2", "--slurm_tasks_per_node=2")
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
  print(f"slurm grid on gs:// in {time.time() - t0:.0f} s (Slurm up in {slurm.start_seconds:.1f} s)")
  listed = grid("list", f"--grid={path}", "--json")
  cells = {c["hosts"]: c for c in map(json.loads, listed.stdout.splitlines())}
  return root, cells, path


def test_a_grid_runs_through_slurm_with_its_root_in_a_bucket(finished_grid):
  root, cells, _ = finished_grid
  status = grid("status", f"--root={root}", "--json")
  rows = {r["run_id"]: r for r in map(json.loads, status.stdout.splitlines())}
  assert {c["run_id"] for c in cells.values()} == set(rows), status.stdout + status.stderr
  assert all(r["status"] == "done" and r["attempts"] == 1 for r in rows.values()), rows
  codes = set()
  for hosts, cell in cells.items():
    workdir = f"{root}/{cell['run_id']}"
    job = read(f"{workdir}/status.json")["job"]
    assert (job["nodes"], job["tasks"]) == (1, hosts), job
    logs = sorted(storage.listdir(f"{workdir}/logs"))
    assert logs == [f"slurm-{job['job_id']}-task{i}.log" for i in range(hosts)]  # one log per task
    result = read(f"{workdir}/result.json")
    assert result["status"] == "done" and result["steps"] == cell["steps"]
    codes.add(job["code"])
  # both cells ran the one archive of this checkout shipped through the bucket, unpacked on the node
  (code,) = codes
  assert storage.dirname(code) == f"{root}/.code" and storage.exists(code)
  unpacked = os.path.join(os.environ.get("TMPDIR", "/tmp"), "nsl-code", storage.basename(code).split(".")[0])
  assert os.path.isfile(os.path.join(unpacked, "nsl", "launch.py")), unpacked
  assert squeue() == []


def test_a_cell_requeued_mid_run_finishes_from_its_checkpoint_to_the_same_state(finished_grid, tmp_path):
  ref_root, cells, _ = finished_grid
  cell = cells[1]
  reference = read(f"{ref_root}/{cell['run_id']}/result.json")["state_sha256"]
  path = grid_file(tmp_path, "one", [{"train.steps": STEPS}])  # the same cell alone (same run id)
  root = tmp_path / "requeued"
  workdir = str(root / cell["run_id"])
  runner = run_slurm(path, str(root), popen=True)
  try:
    pids = wait_for(lambda: trainer_pids(workdir), 80, proc=runner)  # started: compiling
    ckpt = os.path.join(workdir, "checkpoints")

    def saving():
      """the cell's first checkpoint (being written or written)"""
      return os.path.isdir(ckpt) and any(n[:1].isdigit() for n in os.listdir(ckpt))
    wait_for(saving, 80, every=0.005, proc=runner)  # a few steps take ~10 ms here: look often
    # Hold the trainer where it is while Slurm requeues its job, so the test cannot lose the race
    # with its last steps; Slurm's own SIGCONT + SIGTERM then ends it with a checkpoint.
    for pid in pids:
      os.kill(pid, signal.SIGSTOP)
    assert not os.path.exists(os.path.join(workdir, "result.json")), "the run ended before it was held"
    job_id = read(os.path.join(workdir, "status.json"))["job"]["job_id"]
    subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
    for pid in pids:
      os.kill(pid, signal.SIGCONT)

    def pending_again():
      """the requeued job back in the queue"""
      show = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
      return "JobState=PENDING" in show
    wait_for(pending_again, 40, proc=runner)
    # Slurm holds a requeued job back for its credential lifetime (120 s); start it now
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True, timeout=30)
    out, _ = runner.communicate(timeout=120)
  finally:
    if runner.poll() is None:
      runner.kill()
  assert runner.returncode == 0, out[-4000:]
  first = open(os.path.join(workdir, "logs", f"slurm-{job_id}-task0.log")).read()
  final = open(os.path.join(workdir, "logs", f"slurm-{job_id}-task0-restart1.log")).read()
  stopped = json.loads(first.strip().splitlines()[-1])
  assert stopped["status"] == "preempted" and 0 < stopped["steps"] < STEPS, first[-2000:]
  assert f"resumed from {workdir}/checkpoints/{stopped['steps']}" in final, final[-2000:]
  status = read(os.path.join(workdir, "status.json"))
  assert status["status"] == "done" and status["attempts"] == 1 and "preempted" not in out  # one attempt
  digest = read(os.path.join(workdir, "result.json"))["state_sha256"]
  print(f"requeued at step {stopped['steps']} of {STEPS}: state_sha256 {digest}, uninterrupted {reference}")
  assert digest == reference


def test_stopping_the_runner_cancels_its_jobs_and_leaves_the_cells_pending(slurm, tmp_path):
  path = grid_file(tmp_path, "long", [{"train.steps": 3000}, {"train.steps": 3001}])
  root = tmp_path / "stopped"
  runner = run_slurm(path, str(root), "--parallel=2", popen=True)
  try:
    def training():
      """both cells training"""
      logs = [p for p in root.glob("*/logs/*.log")]
      return len(logs) == 2 and all("train step" in p.read_text() for p in logs)
    wait_for(training, 80, proc=runner)
    jobs = {read(str(d / "status.json"))["job"]["job_id"] for d in root.iterdir() if (d / "cell.json").is_file()}
    assert len(jobs) == 2 and jobs <= set(squeue())
    runner.send_signal(signal.SIGTERM)
    out, _ = runner.communicate(timeout=240)  # the tasks save first; slow when the other test worker is busy
  finally:
    if runner.poll() is None:
      runner.kill()
  assert not jobs & set(squeue()), out[-3000:]
  for d in (d for d in root.iterdir() if (d / "cell.json").is_file()):
    assert read(str(d / "status.json"))["status"] == "pending", out[-3000:]
    assert read(str(d / "result.json"))["status"] == "preempted"  # the tasks saved: SIGTERM, not a kill
  table = grid("status", f"--root={root}").stdout
  assert table.count("pending") == 2, table


def test_a_held_job_is_said_and_shown_and_the_cell_runs_once_released(slurm, tmp_path):
  path = grid_file(tmp_path, "held", [{"train.steps": 12}])
  root = tmp_path / "held"
  runner = run_slurm(path, str(root), "--slurm_extra=--hold", popen=True)  # submitted held (JobHeldUser)
  try:
    def noted():
      """the held job named in the cell's status.json"""
      cells = [d for d in root.iterdir() if (d / "status.json").is_file()] if root.is_dir() else []
      return cells[0] if cells and read(str(cells[0] / "status.json")).get("note") else None
    cell_dir = wait_for(noted, 80, proc=runner)
    status = read(str(cell_dir / "status.json"))
    job_id = status["job"]["job_id"]
    assert "held (JobHeldUser)" in status["note"] and f"scontrol release {job_id}" in status["note"], status
    table = grid("status", f"--root={root}").stdout
    assert "running" in table and f"Slurm job {job_id} is held (JobHeldUser)" in table, table
    subprocess.run(["scontrol", "release", job_id], check=True, timeout=30)
    out, _ = runner.communicate(timeout=150)
  finally:
    if runner.poll() is None:
      runner.kill()
  assert runner.returncode == 0, out[-3000:]
  assert out.count("is held (JobHeldUser)") == 1, out[-3000:]  # said once, not every poll
  status = read(str(cell_dir / "status.json"))
  assert status["status"] == "done" and status["note"] is None, status


def test_the_job_a_multi_node_gpu_cell_gets_and_how_its_end_is_read():
  """No cluster needed: the batch script of a 4-host cell on 8-GPU nodes, and job ends -> statuses."""
  backend = slurm_backend.SlurmBackend("/grid", partition="h100", time_limit="4:00:00", gpus_per_node=8,
                                       signal_seconds=300, extra=("--exclusive",), python="/opt/py/bin/python")
  cell = types.SimpleNamespace(run_id="xl-abc", hosts=4,
                               launch_args=lambda w: ["--config=configs/sps.py:xl", f"--workdir={w}"])
  script = backend.batch_script(cell, "gs://b/g/xl-abc", "gs://b/g/.code/0123456789abcdef.tar.gz")
  options = [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]
  assert options == ["--job-name=nsl-xl-abc", "--comment=gs://b/g/xl-abc", "--nodes=4", "--ntasks=4",
                     "--ntasks-per-node=1", "--requeue", "--signal=TERM@300", "--output=/tmp/nsl-slurm-%j.out",
                     "--open-mode=append", "--chdir=/tmp", "--partition=h100", "--time=4:00:00",
                     "--gpus-per-node=8", "--exclusive"]
  assert "export JAX_LOCAL_DEVICE_IDS=0,1,2,3,4,5,6,7\n" in script  # all 8 GPUs in the node's one task
  assert "--distributed=auto" in script
  assert "/opt/py/bin/python -m nsl.scaling.task --workdir=gs://b/g/xl-abc" in script
  assert backend.layout(types.SimpleNamespace(hosts=4)) == (4, 4, 1)
  assert slurm_backend.SlurmBackend("/grid", tasks_per_node=2).layout(types.SimpleNamespace(hosts=3)) == (2, 3, 2)
  ends = {("COMPLETED", "0:0"): 0, ("COMPLETED", "2:0"): 2, ("FAILED", "2:0"): 2, ("FAILED", "1:0"): 1,
          ("FAILED", "0:9"): 137, ("CANCELLED", "0:15"): 143, ("NODE_FAIL", "0:0"): slurm_backend.LOST,
          ("PREEMPTED", "0:15"): slurm_backend.LOST, ("TIMEOUT", "0:0"): 1, ("OUT_OF_MEMORY", "0:125"): 1,
          ("GONE", ""): 1}
  assert {k: slurm_backend.exit_status(*k) for k in ends} == ends
