"""How the grid runner starts runs: the backend registry (local, tpu, slurm, ray) and the exec
shim of their children (docs/guide/pods.md).

A backend turns a cell into its running processes and reports the cell's exit status:
  local  each process `python -m nsl.launch ARGS` a subprocess of the runner (this module);
  tpu    `bash launch/tpu_pod.sh CONFIG WORKDIR [--config.a.b=v ...]`, one slice per parallel slot;
  slurm  one Slurm job per cell, one task per node (`nsl.scaling.slurm`);
  ray    one gang of actors per cell on one TPU slice or node group (`nsl.scaling.ray_backend`).
The protocol: `add_arguments(parser)` and `from_args(args, root)` (class methods), `start(cell,
workdir, slot)`, `poll(handle)` (None while running, else 0 / 2 for a user error / other),
`terminate` (SIGTERM to every process: checkpoint and exit), `kill`, `describe(handle)` (what
status.json records) and `close`. Every process runs through `nsl.scaling.task`, so its log is
WORKDIR/logs/NAME.log whatever ran it. Subprocesses ignore SIGINT (the runner turns Ctrl-C into SIGTERM, which the launcher answers
with a checkpoint and status "preempted") and, on Linux, get SIGTERM when the runner dies, so a
killed runner leaves no orphan training into a cell's workdir. They start through this module
(`python -m nsl.scaling.backends PROGRAM ARGS...`, see `spawn`), which imports no other part of
the grid. The runner itself is `nsl.scaling.runner`, the cells' locks `nsl.scaling.locks`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from nsl import storage
from nsl.errors import ConfigError, NslError


# -- processes ------------------------------------------------------------------------------------
def _child_setup() -> None:
  """In the child (run through this module as an exec shim, not a preexec_fn, which is unsafe in
  threaded processes like Ray workers): ignore Ctrl-C; on Linux, SIGTERM when the parent dies."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if sys.platform.startswith("linux"):
    try:
      ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
      pass
  parent = os.environ.pop("NSL_GRID_PARENT", None)
  if parent and os.getppid() != int(parent):  # the parent died before prctl took effect
    sys.exit(143)


def spawn(argv: list[str], log_path: str | None, cwd: str | None = None, env: dict | None = None):
  """Starts `argv` through the shim (see `_child_setup`), output appended to `log_path`."""
  log = open(log_path, "ab") if log_path else subprocess.DEVNULL
  env = dict(os.environ, PYTHONUNBUFFERED="1", NSL_GRID_PARENT=str(os.getpid()), **(env or {}))
  try:
    return subprocess.Popen([sys.executable, "-m", "nsl.scaling.backends", *argv], cwd=cwd, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
  finally:
    if log_path:
      log.close()


# -- backends -------------------------------------------------------------------------------------
CODE_ROOT = str(Path(__file__).resolve().parents[2])  # the checkout the runner runs: cells run from it


class _Handle:
  def __init__(self, procs=(), ref=None, info=None):
    self.procs, self.ref, self.rc, self.info = list(procs), ref, None, dict(info or {})

  @property
  def pid(self) -> int | None:
    return self.procs[0].pid if self.procs else None


CACHE_MAX_BYTES = 4 << 30  # least recently used entries go first past this


def compile_cache_env(cache_dir: str | None) -> dict[str, str]:
  """The environment that points a cell's JAX at the grid's shared compilation cache. A size
  limit turns on JAX's file lock, so parallel cells never read an entry while it is written; a
  JAX_COMPILATION_CACHE_DIR the user set (an empty one turns the cache off) is left alone."""
  if cache_dir is None or "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return {}
  return {"JAX_COMPILATION_CACHE_DIR": cache_dir, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_COMPILATION_CACHE_MAX_SIZE": str(CACHE_MAX_BYTES)}


def task_argv(workdir: str, name: str, program: list[str], python: str | None = None) -> list[str]:
  """`program` as one of a cell's processes (`nsl.scaling.task`: its log in WORKDIR/logs/NAME.log)."""
  return [python or sys.executable, "-m", "nsl.scaling.task", f"--workdir={workdir}", f"--name={name}", "--",
          *program]


def free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def first_failure(rcs: list[int | None]) -> int | None:
  """A multi-process cell's status: None while any runs and none failed, else the first failure
  (a lost process stalls the others' collectives, so they are stopped), else 0."""
  failed = [rc for rc in rcs if rc not in (None, 0)]
  if failed:
    return failed[0]
  return None if any(rc is None for rc in rcs) else 0


class LocalBackend:
  """Each cell's processes as subprocesses of the runner, run from the code root through
  `nsl.scaling.task`; a cell of `hosts` > 1 runs that many processes here, joined by JAX's
  distributed runtime on localhost. Cells share `compile_cache` (a directory) when given."""

  name = "local"
  shares_disk = True  # cells read the grid's data where the runner prepared it (nsl.scaling.griddata)

  def __init__(self, compile_cache: str | None = None, gpus_per_cell: int = 0, isolate: bool = False):
    self.compile_cache, self.gpus_per_cell, self.isolate = compile_cache, gpus_per_cell, isolate
    self.shares_disk = not isolate
    self.homes = tempfile.mkdtemp(prefix="nsl-cells-") if isolate else None

  @classmethod
  def add_arguments(cls, parser) -> None:
    parser.add_argument("--local_gpus_per_cell", type=int, default=0,
                        help="local backend: GPUs each parallel cell sees (CUDA_VISIBLE_DEVICES by slot); 0 = all")
    parser.add_argument("--local_isolate", action="store_true",
                        help="local backend: each process gets its own empty HOME and cache, and the grid's data "
                             "goes to the root, as on workers that share nothing but the root (a rehearsal of a "
                             "cluster run)")

  @classmethod
  def from_args(cls, args, root: str) -> "LocalBackend":
    cache = None if storage.is_remote(root) else storage.join(root, ".jax_cache")
    return cls(cache, args.local_gpus_per_cell, args.local_isolate)

  def _isolated_env(self, name: str) -> dict[str, str]:
    home = tempfile.mkdtemp(prefix=f"{name}-", dir=self.homes)
    return {"HOME": home, "NSL_CACHE_DIR": os.path.join(home, ".cache", "nsl")}

  def programs(self, cell, workdir: str) -> list[list[str]]:
    launch = [sys.executable, "-m", "nsl.launch", *cell.launch_args(workdir)]
    if cell.hosts <= 1:
      return [launch]
    port = free_port()
    return [launch + [f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={cell.hosts}",
                      f"--process_id={i}"] + (["--quiet"] if i else []) for i in range(cell.hosts)]

  def command(self, cell, workdir: str) -> list[str]:
    return self.programs(cell, workdir)[0]

  def start(self, cell, workdir: str, slot: int) -> _Handle:
    env = {"NSL_GRID_SLOT": str(slot), **compile_cache_env(self.compile_cache)}
    if self.gpus_per_cell:
      n = self.gpus_per_cell
      env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(slot * n, (slot + 1) * n))
    programs = self.programs(cell, workdir)
    names = ["local"] if len(programs) == 1 else [f"local-process{i}" for i in range(len(programs))]
    procs = [spawn(task_argv(workdir, name, program), None, cwd=CODE_ROOT,
                   env={**env, **(self._isolated_env(name) if self.isolate else {})})
             for name, program in zip(names, programs)]
    return _Handle(procs, info={"pids": [p.pid for p in procs]})

  def poll(self, handle: _Handle) -> int | None:
    if handle.rc is None:
      handle.rc = first_failure([p.poll() for p in handle.procs])
      if handle.rc not in (None, 0):
        self.kill(handle)
    return handle.rc

  def terminate(self, handle: _Handle) -> None:
    for p in handle.procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)

  def kill(self, handle: _Handle) -> None:
    for p in handle.procs:
      if p.poll() is None:
        p.kill()
        p.wait()

  def describe(self, handle: _Handle) -> dict:
    return handle.info

  def close(self) -> None:
    if self.homes:
      import shutil
      shutil.rmtree(self.homes, ignore_errors=True)


class TpuBackend(LocalBackend):
  """Each cell `bash launch/tpu_pod.sh CONFIG WORKDIR [overrides]` (the script runs it on every
  host of a Cloud TPU slice and returns when it ends). `--tpu_names=a,b`: the runner's parallel
  slot i uses slice i, so `--parallel` cells run on as many slices at once; routing cells by slice
  type, with preempted slices replaced, is the Ray backend's job (docs/guide/pods.md)."""

  name = "tpu"
  shares_disk = False

  def __init__(self, script: str = "launch/tpu_pod.sh", names: tuple[str, ...] = ()):
    super().__init__(compile_cache=None)  # the pod compiles, not this host
    self.shares_disk = False
    path = Path(script)
    if not path.is_file() and not path.is_absolute():
      path = Path(CODE_ROOT) / script
    if not path.is_file():
      raise ConfigError(f"--tpu_script={script}: no such script (the TPU backend launches every cell "
                        "through it)")
    self.script, self.names = str(path), names

  @classmethod
  def add_arguments(cls, parser) -> None:
    parser.add_argument("--tpu_script", default="launch/tpu_pod.sh", help="tpu backend: the pod launch script")
    parser.add_argument("--tpu_names", default=os.environ.get("TPU_NAME", ""),
                        help="tpu backend: comma-separated TPU VM names, one per parallel slot (default $TPU_NAME)")

  @classmethod
  def from_args(cls, args, root: str) -> "TpuBackend":
    names = tuple(n for n in args.tpu_names.split(",") if n)
    if names and len(names) < args.parallel:
      raise ConfigError(f"--parallel={args.parallel} needs as many --tpu_names (got {len(names)}): two cells "
                        "on one slice would fight over its TPU")
    return cls(args.tpu_script, names)

  def programs(self, cell, workdir: str) -> list[list[str]]:
    config, workdir_arg, *overrides = cell.launch_args(workdir)
    return [["bash", self.script, config.split("=", 1)[1], workdir_arg.split("=", 1)[1], *overrides]]

  def start(self, cell, workdir: str, slot: int) -> _Handle:
    env = {"NSL_GRID_SLOT": str(slot), **({"TPU_NAME": self.names[slot]} if self.names else {})}
    proc = spawn(task_argv(workdir, f"tpu-{self.names[slot] if self.names else slot}", self.command(cell, workdir)),
                 None, cwd=CODE_ROOT, env=env)
    return _Handle([proc], info={"tpu_name": env.get("TPU_NAME", os.environ.get("TPU_NAME"))})


BACKENDS = {"local": "nsl.scaling.backends:LocalBackend", "tpu": "nsl.scaling.backends:TpuBackend",
            "slurm": "nsl.scaling.slurm:SlurmBackend", "ray": "nsl.scaling.ray_backend:RayBackend"}


def backend_class(name: str):
  import importlib

  if name not in BACKENDS:
    raise ConfigError(f"--backend={name}: choose one of {', '.join(BACKENDS)}")
  module, _, attr = BACKENDS[name].partition(":")
  try:
    return getattr(importlib.import_module(module), attr)
  except ImportError as e:
    raise NslError(f"--backend={name} needs the package {e.name!r} (pip install -e '.[{name}]')") from None


def add_arguments(parser) -> None:
  """Every backend's own flags on `grid run` (a backend that cannot be imported here adds none)."""
  for name in BACKENDS:
    try:
      backend_class(name).add_arguments(parser)
    except NslError:
      pass


def make_backend(name: str, args, root: str):
  return backend_class(name).from_args(args, root)


if __name__ == "__main__":  # the exec shim: python -m nsl.scaling.backends PROGRAM ARGS...
  if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    print("usage: python -m nsl.scaling.backends PROGRAM [ARGS...]\n\nThe grid runner's exec shim, not a "
          "user command: ignores Ctrl-C, asks for SIGTERM when its parent dies, then becomes PROGRAM.",
          file=sys.stdout if len(sys.argv) >= 2 else sys.stderr)
    raise SystemExit(0 if len(sys.argv) >= 2 else 2)
  _child_setup()
  os.execvp(sys.argv[1], sys.argv[1:])
