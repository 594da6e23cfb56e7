"""How the grid runner starts runs: backends (local, tpu, ray) and the exec shim of their children.

A backend turns a cell into a running launcher command and reports its exit code:
  local  `python -m nsl.launch ARGS` as a subprocess of the runner;
  tpu    `bash launch/tpu_pod.sh CONFIG WORKDIR [--config.a.b=v ...]` as a subprocess (the script
         starts the run on a Cloud TPU pod and returns when it ends); NSL_GRID_SLOT=i (0..N-1)
         tells it which of the runner's N parallel slots it fills, e.g. to pick a pod;
  ray    a `ray.remote` task per cell on an existing cluster (`ray.init(address=...)`) that runs
         the same launcher command with the worker's Python; workdirs must be on a file system
         the workers and the runner share.
Subprocesses ignore SIGINT (the runner turns Ctrl-C into SIGTERM, which the launcher answers
with a checkpoint and status "preempted") and, on Linux, get SIGTERM when the runner dies, so a
killed runner leaves no orphan training into a cell's workdir. They start through this module
(`python -m nsl.scaling.backends PROGRAM ARGS...`, see `spawn`), which imports no other part of
the grid. The runner itself is `nsl.scaling.runner`, the cells' locks `nsl.scaling.locks`.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from nsl.errors import ConfigError, NslError
from nsl.scaling.locks import CHILD_GRACE_SECONDS


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
class _Handle:
  def __init__(self, proc=None, ref=None):
    self.proc, self.ref, self.rc = proc, ref, None

  @property
  def pid(self) -> int | None:
    return self.proc.pid if self.proc is not None else None


CACHE_MAX_BYTES = 4 << 30  # least recently used entries go first past this


def compile_cache_env(cache_dir: str | None) -> dict[str, str]:
  """The environment that points a cell's JAX at the grid's shared compilation cache. A size
  limit turns on JAX's file lock, so parallel cells never read an entry while it is written; a
  JAX_COMPILATION_CACHE_DIR the user set (an empty one turns the cache off) is left alone."""
  if cache_dir is None or "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return {}
  return {"JAX_COMPILATION_CACHE_DIR": cache_dir, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_COMPILATION_CACHE_MAX_SIZE": str(CACHE_MAX_BYTES)}


class LocalBackend:
  """Each cell a `python -m nsl.launch` subprocess, sharing `compile_cache` (a directory) if given."""

  name = "local"

  def __init__(self, compile_cache: str | None = None):
    self.compile_cache = compile_cache

  def command(self, cell, workdir: str) -> list[str]:
    return [sys.executable, "-m", "nsl.launch", *cell.launch_args(workdir)]

  def start(self, cell, workdir: str, log_path: str, slot: int) -> _Handle:
    env = {"NSL_GRID_SLOT": str(slot), **compile_cache_env(self.compile_cache)}
    return _Handle(proc=spawn(self.command(cell, workdir), log_path, env=env))

  def poll(self, handle: _Handle) -> int | None:
    return handle.proc.poll()

  def terminate(self, handle: _Handle) -> None:
    if handle.proc.poll() is None:
      handle.proc.send_signal(signal.SIGTERM)

  def kill(self, handle: _Handle) -> None:
    if handle.proc.poll() is None:
      handle.proc.kill()
      handle.proc.wait()

  def close(self) -> None:
    pass


class TpuBackend(LocalBackend):
  """Each cell `bash launch/tpu_pod.sh CONFIG WORKDIR [overrides]` (the script runs it on a pod)."""

  name = "tpu"

  def __init__(self, script: str = "launch/tpu_pod.sh"):
    super().__init__(compile_cache=None)  # the pod compiles, not this host
    path = Path(script)
    if not path.is_file() and not path.is_absolute():
      path = Path(__file__).resolve().parents[2] / script
    if not path.is_file():
      raise ConfigError(f"--tpu_script={script}: no such script (the TPU backend launches every cell "
                        "through it)")
    self.script = str(path)

  def command(self, cell, workdir: str) -> list[str]:
    config, workdir_arg, *overrides = cell.launch_args(workdir)
    return ["bash", self.script, config.split("=", 1)[1], workdir_arg.split("=", 1)[1], *overrides]


def _ray_run(argv_tail: list[str], cwd: str | None, log_path: str) -> int:
  """Runs on a Ray worker: the launcher with the worker's Python; cancel -> SIGTERM -> checkpoint."""
  proc = spawn([sys.executable, "-m", "nsl.launch", *argv_tail], log_path,
               cwd=cwd if cwd and os.path.isdir(cwd) else None)
  try:
    return proc.wait()
  except BaseException:  # ray.cancel raises KeyboardInterrupt (or TaskCancelledError) in the task
    proc.send_signal(signal.SIGTERM)
    try:
      return proc.wait(timeout=CHILD_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
      proc.kill()
      return proc.wait()


class RayBackend:
  """Each cell a `ray.remote` task on the cluster at `address` ("auto", "ray://...", or "local"
  for a fresh local instance, as the tests use)."""

  name = "ray"

  def __init__(self, address: str = "auto", num_cpus: float = 1.0, num_gpus: float = 0.0,
               resources: dict | None = None, local_cpus: int | None = None):
    try:
      import ray
    except ImportError as e:
      raise NslError("--backend=ray needs the `ray` package (pip install 'ray>=2.9')") from e
    self.ray = ray
    if not ray.is_initialized():
      if address == "local":
        ray.init(num_cpus=local_cpus, include_dashboard=False, log_to_driver=False)
      else:
        try:
          ray.init(address=address, log_to_driver=False)
        except ConnectionError as e:
          raise NslError(f"--ray_address={address}: no Ray cluster there ({e})") from e
    self.remote = ray.remote(_ray_run).options(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources or {},
                                               max_retries=0)
    self.cwd = os.getcwd()

  def command(self, cell, workdir: str) -> list[str]:
    return ["python", "-m", "nsl.launch", *cell.launch_args(workdir)]

  def start(self, cell, workdir: str, log_path: str, slot: int) -> _Handle:
    return _Handle(ref=self.remote.remote(cell.launch_args(workdir), self.cwd, log_path))

  def poll(self, handle: _Handle) -> int | None:
    if handle.rc is None:
      done, _ = self.ray.wait([handle.ref], timeout=0)
      if done:
        try:
          handle.rc = int(self.ray.get(done[0]))
        except Exception:  # the task died or was cancelled
          handle.rc = -1
    return handle.rc

  def terminate(self, handle: _Handle) -> None:
    self.ray.cancel(handle.ref, force=False)

  def kill(self, handle: _Handle) -> None:
    self.ray.cancel(handle.ref, force=True)

  def close(self) -> None:
    pass


def make_backend(name: str, **kwargs):
  if name == "local":
    return LocalBackend(kwargs.get("compile_cache"))
  if name == "tpu":
    return TpuBackend(kwargs.get("tpu_script") or "launch/tpu_pod.sh")
  if name == "ray":
    resources = json.loads(kwargs.get("ray_resources") or "{}")
    return RayBackend(kwargs.get("ray_address") or "auto", kwargs.get("ray_num_cpus", 1.0),
                      kwargs.get("ray_num_gpus", 0.0), resources, kwargs.get("ray_local_cpus"))
  raise ConfigError(f"--backend={name}: choose local, tpu or ray")


if __name__ == "__main__":  # the exec shim: python -m nsl.scaling.backends PROGRAM ARGS...
  if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    print("usage: python -m nsl.scaling.backends PROGRAM [ARGS...]\n\nThe grid runner's exec shim, not a "
          "user command: ignores Ctrl-C, asks for SIGTERM when its parent dies, then becomes PROGRAM.",
          file=sys.stdout if len(sys.argv) >= 2 else sys.stderr)
    raise SystemExit(0 if len(sys.argv) >= 2 else 2)
  _child_setup()
  os.execvp(sys.argv[1], sys.argv[1:])
