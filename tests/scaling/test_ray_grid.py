"""`grid run --backend=ray` on a real Ray cluster on this host (docs/guide/pods.md#ray).

Four raylets stand for two slices of type "cpu2" with two hosts each, named as Ray names a Cloud TPU
slice's hosts: TPU-cpu2-head on host 0 of each, and the slice's own name ("slice-a", "slice-b") on
every host of it. The cells are configs/tiny.py with 2 processes each (one CPU device per process,
gloo collectives), run through the grid CLI as a user would. The cluster: tests/cluster/ray_slices.py.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from nsl.errors import ConfigError
from nsl.scaling.ray_backend import head_resource, slice_hosts, slice_resource
from tests.cluster.ray_slices import own_disk, ray_slices  # noqa: F401 (the module's Ray cluster; ray is in [dev])
from tests.helpers import ROOT, SUBPROCESS_XLA_FLAGS, make_corpus, run_cli

STEPS, EVERY = 120, 20  # a checkpoint every 20 steps: the kill lands with 100 steps still to go


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("raygrid")
  corpus = make_corpus(str(d))
  return d, corpus, os.path.join(os.path.dirname(corpus), "text", "*.txt")


def write_grid(data, name: str, seeds: list[int], slice_type: str = "cpu2") -> str:
  d, corpus, text = data
  path = d / name
  path.write_text(textwrap.dedent(f"""
      def get_grid():
        return {{"base": "configs/tiny.py",
                "overrides": {{"hosts": 2, "slice": {slice_type!r}, "data.path": {corpus!r},
                              "data.sources": ({text!r},), "data.tokenizer": "byte", "data.val_fraction": 0.2,
                              "model.vocab_size": 257,
                              "model.d_model": 32, "model.n_layers": 2, "model.n_heads": 2, "model.d_ff": 96,
                              "data.seq_len": 64, "train.batch_size": 8, "train.warmup_steps": 1,
                              "train.decay_steps": 1, "train.steps": {STEPS}, "train.log_every": {EVERY},
                              "train.eval_every": 100000, "train.eval_batches": 1, "checkpoint.every": {EVERY},
                              "checkpoint.async_save": False}},
                "axes": {{"seed": {seeds!r}}}}}
  """))
  return str(path)


def grid_run(grid: str, root, cluster) -> list[str]:
  return [sys.executable, "-m", "nsl.scaling.grid", "run", f"--grid={grid}", f"--root={root}", "--backend=ray",
          f"--ray_address={cluster.address}", "--parallel=2", "--poll_seconds=0.2"]


def cell_dirs(root) -> list:
  return sorted(p.parent for p in root.glob("*/cell.json"))


@pytest.fixture(scope="module")
def uninterrupted(ray_slices, data, tmp_path_factory):
  """Both cells (seeds 0 and 1) run to the end, two at a time: the reference digests."""
  root = tmp_path_factory.mktemp("uninterrupted") / "root"
  t0 = time.time()
  proc = run_cli(*grid_run(write_grid(data, "two.py", [0, 1]), root, ray_slices)[1:], timeout=300)
  print(f"ray: two 2-process cells in {time.time() - t0:.1f}s")
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  return root


@pytest.mark.slow
def test_two_cells_run_at_once_on_the_two_slices(uninterrupted):
  cells = cell_dirs(uninterrupted)
  assert len(cells) == 2
  spans, slices = [], []
  for d in cells:
    status = json.loads((d / "status.json").read_text())
    assert status["status"] == "done" and status["attempts"] == 1 and status["job"]["slice_type"] == "cpu2"
    assert json.loads((d / "result.json").read_text())["processes"] == 2
    spans.append([time.mktime(time.strptime(status[k], "%Y-%m-%dT%H:%M:%S")) for k in ("started", "finished")])
    logs = sorted(p.name for p in (d / "logs").glob("*.log"))  # one per host, named after its slice
    assert len(logs) == 2 and logs[0].endswith("-host0.log") and logs[1].endswith("-host1.log"), logs
    slices.append(logs[0].rsplit("-host", 1)[0])
  (a0, a1), (b0, b1) = spans
  assert a0 < b1 and b0 < a1, spans  # they ran at the same time ...
  assert sorted(slices) == ["slice-a", "slice-b"]  # ... each on every host of its own slice


def trainer(workdir: str, process_id: int):
  """The trainer process (not its nsl.scaling.task parent) of one host of the cell at `workdir`."""
  import psutil

  for p in psutil.process_iter(["cmdline"]):
    cmd = p.info["cmdline"] or []
    if cmd[1:3] == ["-m", "nsl.launch"] and f"--workdir={workdir}" in cmd and f"--process_id={process_id}" in cmd:
      return p
  return None


def wait_for(what, runner, timeout: float = 120):
  deadline = time.time() + timeout
  while time.time() < deadline:
    assert runner.poll() is None, runner.stdout.read()[-3000:]
    found = what()
    if found:
      return found
    time.sleep(0.05)
  raise AssertionError(f"timed out waiting for {what.__doc__}")


def checkpoints(workdir) -> list[int]:
  """the completed checkpoints (not their *-tmp directories)"""
  d = workdir / "checkpoints"
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if d.is_dir() else []


def host_logs(workdir) -> str:
  return "".join(p.read_text() for p in sorted((workdir / "logs").glob("*-host0.log")))


def start_runner(cmd: list[str]) -> subprocess.Popen:
  return subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, XLA_FLAGS=SUBPROCESS_XLA_FLAGS), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(runner: subprocess.Popen) -> None:
  if runner.poll() is None:
    os.killpg(runner.pid, signal.SIGKILL)
    runner.wait()


@pytest.mark.slow
def test_a_killed_host_is_rescheduled_and_resumes_to_the_same_bits(uninterrupted, ray_slices, data, tmp_path):
  """SIGKILL to one host's trainer after a checkpoint: the cell fails, is rescheduled, resumes from
  that checkpoint and ends with the uninterrupted run's state digest."""
  root = tmp_path / "root"
  runner = start_runner(grid_run(write_grid(data, "one.py", [0]), root, ray_slices))
  try:
    workdir = wait_for(lambda: next((d for d in cell_dirs(root) if checkpoints(d)), None), runner)
    victim = wait_for(lambda: trainer(str(workdir), 1), runner)
    code = victim.cwd()  # the runner's code as Ray shipped it, not this checkout
    victim.send_signal(signal.SIGKILL)
    out = runner.communicate(timeout=180)[0]
  finally:
    stop(runner)
  assert runner.returncode == 0, out[-3000:]
  assert code != ROOT and all(os.path.isfile(os.path.join(code, f)) for f in ("nsl/launch.py", "nsl/data/prepare.py",
                                                                              "configs/tiny.py")), code
  assert re.search(r"failed seed0-\S+ \(exit \d+\).*retrying from its last checkpoint", out), out[-3000:]
  resumed = re.findall(r"resumed from \S+/checkpoints/(\d+)", host_logs(workdir))
  assert resumed and 0 < int(resumed[0]) < STEPS, host_logs(workdir)[-3000:]  # the kill landed mid-run
  status = json.loads((workdir / "status.json").read_text())
  assert status["status"] == "done" and status["attempts"] == 2 and status["failures"] == 1, status
  reference = {json.loads((d / "cell.json").read_text())["config_hash"]: d for d in cell_dirs(uninterrupted)}
  same = reference[json.loads((workdir / "cell.json").read_text())["config_hash"]]
  digest = lambda d: json.loads((d / "result.json").read_text())["state_sha256"]
  assert digest(workdir) == digest(same) is not None


@pytest.mark.slow
def test_a_stopped_runner_makes_every_host_checkpoint_and_exit(ray_slices, data, tmp_path):
  root = tmp_path / "root"
  runner = start_runner(grid_run(write_grid(data, "one.py", [0]), root, ray_slices))
  try:
    workdir = wait_for(lambda: next((d for d in cell_dirs(root) if checkpoints(d)), None), runner)
    hosts = [wait_for(lambda: trainer(str(workdir), i), runner) for i in (0, 1)]
    runner.send_signal(signal.SIGTERM)
    out = runner.communicate(timeout=300)[0]
  finally:
    stop(runner)
  assert runner.returncode == 1 and "stopping: SIGTERM to 1 run(s)" in out, out[-3000:]
  stopped = json.loads((workdir / "result.json").read_text())
  assert stopped["status"] == "preempted" and 0 < stopped["steps"] < STEPS, (stopped, out[-2000:])
  assert stopped["steps"] in checkpoints(workdir)  # it saved where it stopped
  assert not any(h.is_running() for h in hosts)  # both hosts' trainers exited
  status = json.loads((workdir / "status.json").read_text())
  assert status["status"] == "pending" and status["attempts"] == 1 and not status.get("failures"), status


@pytest.mark.slow
def test_a_slice_type_the_cluster_lacks_fails_the_cell_once_with_the_reason(ray_slices, data, tmp_path):
  root = tmp_path / "root"
  proc = run_cli(*grid_run(write_grid(data, "cpu4.py", [0], "cpu4"), root, ray_slices)[1:], timeout=120)
  assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
  (workdir,) = cell_dirs(root)
  status = json.loads((workdir / "status.json").read_text())
  assert status["status"] == "failed" and status["attempts"] == 1 and status["returncode"] == 2, status
  assert "TPU-cpu4-head" in status["error"], status["error"]


def test_slices_are_found_by_the_resources_ray_gives_tpu_vms_and_node_groups_by_the_same_rule():
  node = lambda i, **res: {"NodeID": f"n{i}", "Alive": True, "Resources": {"CPU": 8, "memory": 1,
                                                                          f"node:10.0.0.{i}": 1, **res}}
  # a v4-16 as Ray starts it: the TPU's name on both hosts, the head resource on worker 0
  tpu = [node(0, TPU=4, **{"TPU-v4-16-head": 1, "my-tpu": 1, "accelerator_type:TPU-V4": 1}),
         node(1, TPU=4, **{"my-tpu": 1, "accelerator_type:TPU-V4": 1})]
  assert slice_resource("n0", tpu, 2, "TPU-v4-16-head") == ("my-tpu", 2)
  assert (head_resource("v4-16"), slice_hosts("v4-16", 1)) == ("TPU-v4-16-head", 2)
  assert (head_resource("v5e-16"), slice_hosts("v5litepod-16", 1)) == ("TPU-v5litepod-16-head", 4)
  assert head_resource("v5e:4x4") == "TPU-v5litepod-16-head" and head_resource("v5p:2x2x2") == "TPU-v5p-16-head"
  with pytest.raises(ConfigError, match="a v5p-16 slice has 2 hosts"):
    slice_hosts("v5p-16", 3)
  # two GPU node groups: a resource on every GPU node, a name per group; the slice is the group
  head = "TPU-gpu8x2-head"
  gpus = [node(i, GPU=8, **{"gpu-node": 1, ("group-a" if i < 2 else "group-b"): 1},
               **({head: 1} if i in (0, 2) else {})) for i in range(4)]
  assert slice_resource("n2", gpus, 2, head) == ("group-b", 2) and slice_hosts("gpu8x2", 2) == 2
  assert slice_resource("n2", gpus, 3, head) == ("group-b", 2)  # too small a slice: the cell waits
  gpus[3].update(Alive=False, Resources={})  # a host down, as Ray lists it: group-b is still the slice
  assert slice_resource("n2", gpus, 2, head) == ("group-b", 1)  # (never gpu-node, which spans two heads)
  gpus[2]["Resources"].pop("group-b")
  assert slice_resource("n2", gpus, 2, head) == (None, 0)  # a head without its slice's name: exit 2


@pytest.mark.slow
def test_a_lost_node_is_a_preemption_and_the_cell_resumes_on_a_whole_slice(uninterrupted, ray_slices, data,
                                                                          tmp_path):
  """A host of the cell's slice goes away (its raylet is killed, as a preempted TPU VM's): the
  backend reports the cell LOST, the runner reschedules it as a preemption (no failure counted)
  and it resumes from its checkpoint on a whole slice, to the uninterrupted run's digest."""
  root = tmp_path / "root"
  runner = start_runner(grid_run(write_grid(data, "one.py", [0]), root, ray_slices))
  first = []
  try:
    workdir = wait_for(lambda: next((d for d in cell_dirs(root) if checkpoints(d)), None), runner)
    first = [wait_for(lambda: trainer(str(workdir), i), runner) for i in (0, 1)]
    name = next((workdir / "logs").glob("*-host1.log")).name.rsplit("-host", 1)[0]
    hosts = ray_slices.hosts[name]
    ray_slices.remove_node(hosts[1])
    with pytest.MonkeyPatch.context() as mp:  # the recreated raylet's environment is its trainers', as
      mp.setenv("XLA_FLAGS", SUBPROCESS_XLA_FLAGS)  # the fixture's: not this process's 8 fake devices
      mp.setenv("JAX_PLATFORMS", "cpu")
      hosts[1] = ray_slices.add_node(num_cpus=0, resources={name: 1}, **own_disk(9))  # the host, recreated
    out = runner.communicate(timeout=180)[0]
  finally:
    stop(runner)
    for p in first:  # the lost node's trainer outlives its raylet here (a preempted VM takes it along)
      if p.is_running():
        p.kill()
  assert runner.returncode == 0, out[-3000:]
  assert re.search(rf"preempted seed0-\S+ after", out) and "failed" not in out, out[-3000:]
  status = json.loads((workdir / "status.json").read_text())
  assert status["status"] == "done" and status["attempts"] == 2 and status["failures"] == 0, status
  assert "was lost" in (workdir / "logs" / "ray.log").read_text()
  resumed = re.findall(r"resumed from \S+/checkpoints/(\d+)", host_logs(workdir))
  assert resumed and 0 < int(resumed[0]) < STEPS, host_logs(workdir)[-3000:]
  reference = {json.loads((d / "cell.json").read_text())["config_hash"]: d for d in cell_dirs(uninterrupted)}
  same = reference[json.loads((workdir / "cell.json").read_text())["config_hash"]]
  digest = lambda d: json.loads((d / "result.json").read_text())["state_sha256"]
  assert digest(workdir) == digest(same) is not None
