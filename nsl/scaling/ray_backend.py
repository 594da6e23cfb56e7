"""`grid run --backend=ray`: each cell one gang of Ray actors on one TPU slice or node group, every
host of it or none (docs/guide/pods.md#ray).

What the cluster's nodes carry (Ray gives Cloud TPU VMs the first two itself):
  TPU-<type>-head: 1  host 0 of every slice of type <type>: a Cloud TPU type (v5p-16, v4-32,
                      v5litepod-16; a cell may say v5e-16) or a node group's type of your own naming
                      (`ray start --resources='{"TPU-gpu8x2-head": 1, "group-a": 1}'`);
  <slice name>: 1     every host of that slice, a name no node outside it carries (the TPU's own
                      name on TPU VMs, e.g. "group-a" / "group-b" for node groups);
  --ray_host_resources (e.g. '{"TPU": 4}', '{"GPU": 8}'): what each host's process takes, so Ray
                      hands it the host's chips (TPU_VISIBLE_CHIPS, CUDA_VISIBLE_DEVICES).
A cell goes to the slice type `cell.slice`, else `--ray_slice` (a type, or a TPU generation such
as v5p: the smallest slice of it the cell fits, `nsl.scaling.plan.smallest_slice`). It runs one
process per host: a TPU type's host count, else `cell.hosts`.

A cell runs as Ray Train's JaxTrainer (`ray.util.tpu.SlicePlacementGroup`), Levanter and Marin
run theirs: a placement group of one bundle {TPU-<type>-head: 1} claims a slice; its name is read
off the head node's resources (of those no other head carries, the one on the fewest nodes, at
least as many as the cell's hosts; a slice with a host down is let go and asked for again); a
STRICT_SPREAD placement group of one bundle {<slice name>: 1, host resources} per host claims
its hosts atomically; one `HostActor` per bundle runs `python -m nsl.scaling.task
--name=<slice name>-host<i> -- python -m nsl.launch ARGS --coordinator_address=<host 0>:<a free
port> --num_processes=N --process_id=i` (a Cloud TPU slice: `--distributed=auto`: JAX reads it
itself) from the runner's code, shipped as the Ray job's runtime environment `working_dir` (the
actors' cwd, so the cells' relative config paths resolve). A one-host slice needs no name: its
head is all of it. Several cells run on several slices at once (`--parallel` of them); a cell
waits while every slice of its type is busy.
`--ray_address=local` starts a one-node cluster here whose node is a one-host slice "local".

`poll`: every process exited 0 -> 0; one failed -> the others are killed (their collectives
would stall) and its status is the cell's; a host's actor died (its node was lost: a preempted
slice) -> `runner.LOST`, which the runner reschedules, the cell resuming from its checkpoint.
`terminate`: SIGTERM to every host's task, which forwards it to the trainer (checkpoint, exit);
`kill`: SIGKILL to every host's processes. The placement groups go when the cell ends. What the
backend itself has to say about a cell (a slice type no node carries: status 2) is written to
WORKDIR/logs/ray.log, beside the hosts' logs, where `grid status` finds a failed cell's error.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time

from nsl import storage
from nsl.errors import ConfigError, NslError
from nsl.scaling.runner import LOST

RAY_OWN = {"CPU", "GPU", "TPU", "memory", "object_store_memory"}  # never a slice's name
# The code root's paths that are not code (anchored: nsl/data is a package).
EXCLUDES = ["/.git", "/.venv", "/runs", "/data", "/site", "/build", "/.cache", "__pycache__", "*.egg-info",
            ".pytest_cache"]
RETRY_SECONDS = 10.0  # a slice with a host down is let go; the cell asks for one again after this
KILL_WAIT_SECONDS = 20.0  # how long kill() waits for the hosts to confirm their processes are gone


# -- slices ---------------------------------------------------------------------------------------
def tpu_type(slice_type: str):
  """(generation, chips, hosts) of a Cloud TPU slice type, None for a node group's own name."""
  from nsl import topology
  try:
    g, shape = topology.parse(slice_type)
  except ConfigError:
    return None
  chips = math.prod(shape)
  return g, chips, chips // math.prod(topology._host_bounds(g, shape))


def head_resource(slice_type: str) -> str:
  """The resource Ray puts on host 0 of a slice: TPU-<Cloud's accelerator type>-head."""
  tpu = tpu_type(slice_type)
  if tpu is None:
    return f"TPU-{slice_type}-head"
  g, chips, _ = tpu  # Cloud's name, whichever way the cell wrote it; v5e slices are v5litepod-N there
  return f"TPU-{'v5litepod' if g.name == 'v5e' else g.name}-{chips * g.cores_per_name_unit}-head"


def slice_hosts(slice_type: str, cell_hosts: int) -> int:
  """Processes the cell runs: one per host of a TPU slice, else the cell's own `hosts`."""
  tpu = tpu_type(slice_type)
  if tpu is None:
    return max(1, int(cell_hosts))
  if cell_hosts not in (1, tpu[2]):
    raise ConfigError(f"the cell asks for hosts={cell_hosts}, but a {slice_type} slice has {tpu[2]} hosts "
                      "and a cell takes all of them; drop `hosts` or pick another slice")
  return tpu[2]


def slice_resource(head_node: str, nodes: list[dict], hosts: int, head: str) -> tuple[str | None, int]:
  """The name of the slice whose head is `head_node`, and how many live nodes carry it: of the
  custom resources that node carries and no other node with the head resource `head` does, the
  one on the fewest live nodes, at least `hosts` of them, else the one on the most (a host of the
  slice is down: Ray lists a dead node without resources). None when there is no such resource."""
  live = [n for n in nodes if n.get("Alive")]
  head_resources = next((n["Resources"] for n in live if n["NodeID"] == head_node), {})
  own = lambda k: k in RAY_OWN or k.startswith(("node:", "accelerator_type:")) or k.endswith("-head") or "_group_" in k
  groups = {k: [n for n in live if n["Resources"].get(k, 0) >= 1] for k in head_resources if not own(k)}
  groups = {k: g for k, g in groups.items() if not any(n["Resources"].get(head) for n in g if n["NodeID"] != head_node)}
  if not groups:
    return None, 0
  fits = sorted((len(g), k) for k, g in groups.items() if len(g) >= hosts)
  name = fits[0][1] if fits else max(sorted(groups), key=lambda k: len(groups[k]))
  return name, len(groups[name])


def runtime_env() -> dict:
  """The runner's own code for the actors: the checkout as the working dir, or the nsl package."""
  from nsl.scaling.backends import CODE_ROOT

  if os.path.isfile(os.path.join(CODE_ROOT, "pyproject.toml")):
    return {"working_dir": CODE_ROOT, "excludes": EXCLUDES}
  return {"py_modules": [os.path.join(CODE_ROOT, "nsl")], "excludes": ["__pycache__"]}  # an installed nsl


# -- one host -------------------------------------------------------------------------------------
class HostActor:
  """One host of a gang: runs the cell's process there through `nsl.scaling.task` (a threaded
  Ray actor, so `signal` reaches a `run` in progress)."""

  def __init__(self):
    self.proc, self.signals, self.lock = None, [], threading.Lock()

  def where(self) -> dict:
    import socket
    import ray

    with socket.socket() as s:  # a free port here, in case this host coordinates
      s.bind(("", 0))
      port = s.getsockname()[1]
    return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
            "host": os.uname().nodename, "pid": os.getpid(), "cwd": os.getcwd(), "port": port}

  def run(self, workdir: str, name: str, launch_args: list[str]) -> int:
    from nsl.scaling.backends import task_argv

    program = [sys.executable, "-m", "nsl.launch", *launch_args]
    with self.lock:
      if self.signals:  # stopped before it started
        return 128 + self.signals[0]
      self.proc = subprocess.Popen(task_argv(workdir, name, program, sys.executable), cwd=os.getcwd(),
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    return self.proc.wait()

  def signal(self, signum: int) -> bool:
    """SIGTERM to the task (it forwards it to the trainer); SIGKILL to its whole process group."""
    with self.lock:
      self.signals.append(signum)
      if self.proc is None or self.proc.poll() is not None:
        return False
      try:
        if signum == signal.SIGKILL:
          os.killpg(self.proc.pid, signal.SIGKILL)
        else:
          self.proc.send_signal(signum)
      except ProcessLookupError:
        return False
      return True


# -- the backend ----------------------------------------------------------------------------------
class Gang:
  """A cell on the cluster: its placement groups, actors and each host's `run` (the handle)."""

  def __init__(self, cell, workdir: str, slice_type: str, hosts: int):
    self.cell, self.workdir, self.slice_type, self.hosts = cell, workdir, slice_type, hosts
    self.state, self.rc = "placing", None  # placing -> hosts -> starting -> running -> ended
    self.head_pg = self.pg = self.ready = None
    self.retry_at = 0.0  # when to ask for a slice again after one with a host down
    self.actors, self.where, self.runs, self.rcs = [], [], [], []
    self.slice = ""
    self.info = {"slice_type": slice_type, "hosts": hosts, "head_resource": head_resource(slice_type)}


class RayBackend:
  """Grid cells as gangs of actors on a Ray cluster's TPU slices or node groups (module docstring).
  It connects to the cluster itself, shipping the runner's code with the job; where the caller has
  already called `ray.init`, the job (and the code its workers run) is the caller's."""

  name = "ray"

  def __init__(self, address: str = "auto", default_slice: str = "", host_resources: dict | None = None):
    try:
      import ray
    except ImportError as e:
      raise NslError("--backend=ray needs the `ray` package (pip install -e '.[ray]')") from e
    self.ray, self.default_slice = ray, default_slice
    self.host_resources = dict(host_resources or {})
    self.started_ray = not ray.is_initialized()
    if self.started_ray:  # the job ships the code (Ray takes a local working_dir at the job level only)
      if address == "local":  # a one-node cluster here: one one-host slice of type "local"
        ray.init(resources={head_resource("local"): 1, "local": 1}, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, runtime_env=runtime_env())
        self.default_slice = self.default_slice or "local"
      else:
        try:
          ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, runtime_env=runtime_env())
        except (ConnectionError, RuntimeError, ValueError) as e:
          raise NslError(f"--ray_address={address}: no Ray cluster there ({' '.join(str(e).split())[:200]})") from e
    options = dict(num_cpus=self.host_resources.get("CPU", 0), num_gpus=self.host_resources.get("GPU", 0),
                   resources={k: v for k, v in self.host_resources.items() if k not in ("CPU", "GPU")},
                   max_concurrency=4, max_restarts=0)
    self.actor_class, self.actor_options = ray.remote(HostActor), options
    self.gangs: list[Gang] = []
    self.plans: dict[str, str] = {}  # config hash -> the smallest slice of --ray_slice's generation

  @classmethod
  def add_arguments(cls, parser) -> None:
    parser.add_argument("--ray_address", default="auto",
                        help="ray backend: 'auto' (this host's cluster, or $RAY_ADDRESS), 'ray://HOST:10001', or "
                             "'local' (a one-node cluster here)")
    parser.add_argument("--ray_slice", default="",
                        help="ray backend: slice type of cells without `slice`: a TPU type (v5p-16), a node group's "
                             "type (its nodes carry TPU-<type>-head), or a TPU generation (v5p: the smallest slice "
                             "of it the cell fits)")
    parser.add_argument("--ray_host_resources", default="{}",
                        help="ray backend: JSON resources each host's process takes, e.g. '{\"TPU\": 4}' or "
                             "'{\"GPU\": 8}'")

  @classmethod
  def from_args(cls, args, root: str) -> "RayBackend":
    try:
      host_resources = json.loads(args.ray_host_resources)
      assert isinstance(host_resources, dict) and all(isinstance(v, (int, float)) for v in host_resources.values())
    except (ValueError, AssertionError):
      raise ConfigError(f"--ray_host_resources={args.ray_host_resources}: give a JSON object of numbers, e.g. "
                        "'{\"TPU\": 4}'") from None
    return cls(args.ray_address, args.ray_slice, host_resources)

  # -- protocol --
  def start(self, cell, workdir: str, slot: int) -> Gang:
    """Asks for the cell's slice (non-blocking: `poll` moves it on once Ray grants it)."""
    try:
      slice_type = self._slice_type(cell)
      gang = Gang(cell, workdir, slice_type, slice_hosts(slice_type, getattr(cell, "hosts", 1)))
    except ConfigError as e:
      gang = Gang(cell, workdir, "?", 1)
      self._end(gang, 2, str(e))
      return gang
    if gang.info["head_resource"] not in self.ray.cluster_resources():
      self._end(gang, 2, f"no node of the Ray cluster carries {gang.info['head_resource']} (host 0 of a "
                         f"{slice_type} slice); start one, or route the cell elsewhere (`slice`, --ray_slice)")
      return gang
    self._ask_for_head(gang)
    self.gangs.append(gang)
    return gang

  def poll(self, gang: Gang) -> int | None:
    if gang.rc is None:
      errors = self.ray.exceptions
      try:
        self._advance(gang)
      except (errors.RayActorError, errors.NodeDiedError, errors.WorkerCrashedError,
              errors.ActorPlacementGroupRemoved) as e:  # a dead actor or node: a lost (preempted) host
        self._end(gang, LOST, f"a host of slice {gang.slice or '?'} was lost ({type(e).__name__})")
      except errors.RayError as e:  # the actor's own code failed (the task would not start)
        self._end(gang, 1, f"{type(e).__name__}: {' '.join(str(e).split())[-300:]}")
    return gang.rc

  def terminate(self, gang: Gang) -> None:
    if gang.rc is None and gang.state == "running":
      for actor in gang.actors:
        actor.signal.remote(signal.SIGTERM)  # each task forwards it: the trainers checkpoint and exit
    elif gang.rc is None:
      self._end(gang, LOST, "stopped before it started")

  def kill(self, gang: Gang) -> None:
    if gang.rc is None:
      self._end(gang, 128 + signal.SIGKILL, "killed")

  def describe(self, gang: Gang) -> dict:
    return dict(gang.info, state=gang.state, **({"slice": gang.slice} if gang.slice else {}))

  def close(self) -> None:
    for gang in list(self.gangs):
      self._end(gang, LOST if gang.rc is None else gang.rc, "the runner closed")
    if self.started_ray:
      self.ray.shutdown()

  # -- a gang's steps (each `poll` goes as far as Ray has granted, never waiting) --
  def _slice_type(self, cell) -> str:
    from nsl import topology

    wanted = getattr(cell, "slice", "") or self.default_slice
    if not wanted:
      raise ConfigError("the cell names no slice type (`slice` in the grid) and --ray_slice is empty; give one "
                        "of them (a TPU type such as v5p-16, a TPU generation, or a node group's type)")
    if wanted in topology.GENERATIONS:  # the smallest slice of that generation the cell fits
      if cell.config_hash not in self.plans:
        from nsl.scaling.plan import smallest_slice
        self.plans[cell.config_hash] = smallest_slice(cell, wanted)
      return self.plans[cell.config_hash]
    return wanted

  def _ready(self, *refs) -> bool:
    done, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=0)
    return len(done) == len(refs)

  def _ask_for_head(self, gang: Gang) -> None:
    """A placement group on one slice's head resource: the claim on a whole slice."""
    head = {gang.info["head_resource"]: 1, **(self.host_resources if gang.hosts == 1 else {})}
    gang.head_pg = self.ray.util.placement_group([head], name=f"nsl-{gang.cell.run_id}-head")
    gang.ready = gang.head_pg.ready()

  def _advance(self, gang: Gang) -> None:
    if gang.state == "placing" and gang.head_pg is None and time.time() >= gang.retry_at:
      self._ask_for_head(gang)
    if gang.state == "placing" and gang.head_pg is not None and self._ready(gang.ready):
      self._claim_hosts(gang)
    if gang.state == "hosts" and self._ready(gang.ready):
      self._start_actors(gang)
    if gang.state == "starting" and self._ready(*gang.where):
      self._launch(gang)
    if gang.state == "running":
      self._collect(gang)

  def _claim_hosts(self, gang: Gang) -> None:
    """The slice whose head the cell holds: all its hosts in one placement group, or none."""
    from ray.util import placement_group_table, remove_placement_group

    head_node = placement_group_table(gang.head_pg)["bundles_to_node_id"][0]
    gang.info["head_node"] = head_node
    name, alive = slice_resource(head_node, self.ray.nodes(), gang.hosts, gang.info["head_resource"])
    if gang.hosts == 1:  # the head is the whole slice
      gang.slice, gang.pg = name or f"node-{head_node[:8]}", gang.head_pg
    elif name is None:
      self._end(gang, 2, f"host 0 of a {gang.slice_type} slice (node {head_node[:8]}) carries no resource that "
                         f"{gang.hosts} nodes of that slice alone share: name each slice's hosts with one (module "
                         "docstring)")
      return
    elif alive < gang.hosts:  # a host of it is down: let the slice go and ask again in a while
      if not gang.info.get("waiting"):
        gang.info["waiting"] = f"slice {name} has {alive} of the {gang.hosts} hosts the cell needs alive"
        self._note(gang, f"waiting: {gang.info['waiting']}")
      remove_placement_group(gang.head_pg)
      gang.head_pg, gang.ready, gang.retry_at = None, None, time.time() + RETRY_SECONDS
      return
    else:
      gang.slice = name
      bundles = [{name: 1, **self.host_resources} for _ in range(gang.hosts)]
      gang.pg = self.ray.util.placement_group(bundles, strategy="STRICT_SPREAD", name=f"nsl-{gang.cell.run_id}")
    gang.ready, gang.state = gang.pg.ready(), "hosts"

  def _start_actors(self, gang: Gang) -> None:
    """One actor per host, host 0 (the coordinator) on the slice's head."""
    from ray.util import placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    nodes = placement_group_table(gang.pg)["bundles_to_node_id"]
    order = sorted(range(gang.hosts), key=lambda i: (nodes[i] != gang.info["head_node"], nodes[i]))
    gang.actors = [self.actor_class.options(**self.actor_options,
                                            scheduling_strategy=PlacementGroupSchedulingStrategy(gang.pg, i)).remote()
                   for i in order]
    gang.where, gang.state = [a.where.remote() for a in gang.actors], "starting"

  def _launch(self, gang: Gang) -> None:
    where = self.ray.get(gang.where)
    gang.info.update(slice=gang.slice, ips=[w["ip"] for w in where], nodes=[w["node_id"] for w in where],
                     code=where[0]["cwd"])
    n, tpu = gang.hosts, tpu_type(gang.slice_type) is not None or "TPU" in self.host_resources
    if tpu:  # a Cloud TPU slice: JAX finds its coordinator and its own place in it
      distributed = lambda i: ["--distributed=auto"]
    else:
      coordinator = f"{where[0]['ip']}:{where[0]['port']}"
      distributed = lambda i: [f"--coordinator_address={coordinator}", f"--num_processes={n}", f"--process_id={i}"]
    for i, actor in enumerate(gang.actors):
      args = gang.cell.launch_args(gang.workdir) + (distributed(i) if n > 1 else []) + (["--quiet"] if i else [])
      gang.runs.append(actor.run.remote(gang.workdir, f"{gang.slice}-host{i}", args))
    gang.rcs, gang.state = [None] * n, "running"

  def _collect(self, gang: Gang) -> None:
    from nsl.scaling.backends import first_failure

    done, _ = self.ray.wait(gang.runs, num_returns=len(gang.runs), timeout=0)
    for ref in done:
      i = gang.runs.index(ref)
      if gang.rcs[i] is None:
        gang.rcs[i] = int(self.ray.get(ref))  # a dead actor raises: poll() calls the host lost
    rc = first_failure(gang.rcs)
    if rc is None:
      return
    if rc and not self._nodes_alive(gang):  # its peers' failures followed a lost node
      rc = LOST
    host = next((i for i, r in enumerate(gang.rcs) if r not in (None, 0)), None)
    self._end(gang, rc, None if rc == 0 else f"{gang.slice}-host{host} exited with status {rc}"
              + ("; a node of the slice is gone (preempted)" if rc == LOST else ""))

  def _nodes_alive(self, gang: Gang) -> bool:
    alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
    return all(node in alive for node in gang.info.get("nodes", []))

  def _end(self, gang: Gang, rc: int, why: str | None) -> None:
    """The cell's status is `rc`: what is left of its processes is killed, its slice released."""
    from ray.util import remove_placement_group

    gang.rc, gang.state = rc, "ended"
    if why:
      gang.info["error"] = why
      self._note(gang, f"error: {why}")
    if gang.actors:  # SIGKILL first: a killed actor's task would only get SIGTERM (and wait for its trainer)
      stops = [a.signal.remote(signal.SIGKILL) for a in gang.actors]
      self.ray.wait(stops, num_returns=len(stops), timeout=KILL_WAIT_SECONDS)
      for actor in gang.actors:
        self.ray.kill(actor, no_restart=True)
    for pg in {id(p): p for p in (gang.pg, gang.head_pg) if p is not None}.values():
      try:
        remove_placement_group(pg)
      except Exception:  # already gone with its node
        pass
    if gang in self.gangs:
      self.gangs.remove(gang)

  def _note(self, gang: Gang, line: str) -> None:
    """The backend's word on a cell, in WORKDIR/logs/ray.log beside the hosts' logs (grid status's error tail)."""
    path = storage.join(gang.workdir, "logs", "ray.log")
    try:
      storage.makedirs(storage.dirname(path))
      old = storage.read_text(path) if storage.exists(path) else ""
      storage.write_text(path, old + f"[{time.strftime('%Y-%m-%dT%H:%M:%S')}] ray backend: {line}\n")
    except Exception as e:  # the record is a courtesy; the status is what the runner acts on
      print(f"nsl.scaling.ray_backend: could not write {path} ({type(e).__name__})", file=sys.stderr)
