"""How the grid runner starts and owns runs: backends (local, tpu, ray), per-cell locks, the runner.

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
killed runner leaves no orphan training into a cell's workdir.

A cell's lock file holds the owning runner's pid, host and process start time, and the child's;
a runner whose process is gone (or whose heartbeat is older than STALE_SECONDS, for other hosts)
has left a stale lock, which the next runner takes over after stopping any leftover child.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from nsl.errors import ConfigError, NslError
from nsl.procs import alive, proc_start
from nsl.scaling.grid import (CELL_FILE, LOCK_FILE, LOG_FILE, STATUS_FILE, Cell, _log_tail, _read_json, _stamp,
                              _write_json, result_status, summarize, update_status)

STALE_SECONDS = 300.0  # a lock from another host without a heartbeat for this long is stale
CHILD_GRACE_SECONDS = 120.0  # time a leftover child gets to checkpoint after SIGTERM


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


# -- locks ----------------------------------------------------------------------------------------
class CellLock:
  """An exclusive, pid-stamped lock file in a cell directory (see the module docstring)."""

  def __init__(self, path: Path, info: dict):
    self.path, self.info = path, info

  @classmethod
  def acquire(cls, path: Path) -> "CellLock | None":
    """The lock, taking over a stale one; None while a live runner holds it."""
    for _ in range(2):
      info = {"pid": os.getpid(), "host": socket.gethostname(), "start": proc_start(os.getpid()),
              "since": time.time(), "child_pid": None, "child_start": None}
      try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        if not cls._take_over(path):
          return None
        continue
      with os.fdopen(fd, "w") as f:
        json.dump(info, f)
      return cls(path, info)
    return None

  @staticmethod
  def read(path: Path) -> dict | None:
    try:
      return json.loads(path.read_text())
    except (OSError, ValueError):
      return None

  @staticmethod
  def held(path: Path, info: dict | None = None) -> bool:
    """Whether a live runner holds the lock at `path`."""
    info = info if info is not None else CellLock.read(path)
    if info is None:  # being written this instant, or unreadable: trust the file's age
      try:
        return time.time() - path.stat().st_mtime < STALE_SECONDS
      except OSError:
        return False
    if info.get("host") == socket.gethostname():
      return alive(info.get("pid"), info.get("start"))
    try:
      return time.time() - path.stat().st_mtime < STALE_SECONDS
    except OSError:
      return False

  @classmethod
  def _take_over(cls, path: Path) -> bool:
    """Removes a stale lock after stopping its leftover child; False if the lock is live."""
    info = cls.read(path)
    if cls.held(path, info):
      return False
    info = info or {}
    child, child_start = info.get("child_pid"), info.get("child_start")
    if info.get("host") == socket.gethostname() and alive(child, child_start):
      stop_process(child, child_start)
    stale = path.with_name(f"{path.name}.stale{os.getpid()}")
    try:
      os.rename(path, stale)  # atomic: of two runners taking over, one wins
    except FileNotFoundError:
      return True
    stale.unlink(missing_ok=True)
    return True

  def set_child(self, pid: int | None) -> None:
    self.info.update(child_pid=pid, child_start=proc_start(pid) if pid else None)
    tmp = self.path.with_name(self.path.name + ".tmp")
    tmp.write_text(json.dumps(self.info))
    os.replace(tmp, self.path)

  def heartbeat(self) -> None:
    try:
      os.utime(self.path)
    except OSError:
      pass

  def release(self) -> None:
    self.path.unlink(missing_ok=True)


def stop_process(pid: int, start: str | None, grace: float = CHILD_GRACE_SECONDS) -> None:
  """SIGTERM (the launcher checkpoints and exits), then SIGKILL after `grace` seconds."""
  try:
    os.kill(pid, signal.SIGTERM)
  except ProcessLookupError:
    return
  deadline = time.time() + grace
  while alive(pid, start) and time.time() < deadline:
    time.sleep(0.2)
  if alive(pid, start):
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


# -- backends -------------------------------------------------------------------------------------
class _Handle:
  def __init__(self, proc=None, ref=None):
    self.proc, self.ref, self.rc = proc, ref, None

  @property
  def pid(self) -> int | None:
    return self.proc.pid if self.proc is not None else None


class LocalBackend:
  """Each cell a `python -m nsl.launch` subprocess."""

  name = "local"

  def command(self, cell, workdir: str) -> list[str]:
    return [sys.executable, "-m", "nsl.launch", *cell.launch_args(workdir)]

  def start(self, cell, workdir: str, log_path: str, slot: int) -> _Handle:
    return _Handle(proc=spawn(self.command(cell, workdir), log_path, env={"NSL_GRID_SLOT": str(slot)}))

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
    return LocalBackend()
  if name == "tpu":
    return TpuBackend(kwargs.get("tpu_script") or "launch/tpu_pod.sh")
  if name == "ray":
    resources = json.loads(kwargs.get("ray_resources") or "{}")
    return RayBackend(kwargs.get("ray_address") or "auto", kwargs.get("ray_num_cpus", 1.0),
                      kwargs.get("ray_num_gpus", 0.0), resources, kwargs.get("ray_local_cpus"))
  raise ConfigError(f"--backend={name}: choose local, tpu or ray")



# -- the runner -----------------------------------------------------------------------------------
class Runner:
  """Runs a grid's unfinished cells, `parallel` at a time, each with up to 1 + `retries` failed
  attempts (a cell whose launcher exits with status 2, a user error, is not retried: it would
  fail the same way). A run that ends "preempted" is restarted without counting as a failure."""

  MAX_PREEMPTIONS = 50

  def __init__(self, cells: list[Cell], root: str, backend, parallel: int = 1, retries: int = 2,
               poll_seconds: float = 1.0, out=sys.stdout):
    if parallel < 1 or retries < 0:
      raise ConfigError(f"--parallel={parallel} must be >= 1 and --retries={retries} >= 0")
    self.cells, self.root, self.backend = cells, Path(root), backend
    self.parallel, self.retries, self.poll_seconds, self.out = parallel, retries, poll_seconds, out
    self.stop_requested = 0

  def _say(self, msg: str) -> None:
    print(f"[grid {_stamp()}] {msg}", file=self.out, flush=True)

  def _prepare(self) -> None:
    self.root.mkdir(parents=True, exist_ok=True)
    for cell in self.cells:
      d = self.root / cell.run_id
      d.mkdir(exist_ok=True)
      if not (d / CELL_FILE).is_file():
        _write_json(d / CELL_FILE, cell.to_json())
      if not (d / STATUS_FILE).is_file():
        update_status(d, run_id=cell.run_id, status="pending", attempts=0, failures=0, created=_stamp())
      if result_status(d) == "done" and (_read_json(d / STATUS_FILE) or {}).get("status") != "done":
        update_status(d, status="done")  # finished after its runner died
      if result_status(d) == "done" and (d / LOCK_FILE).exists() and not CellLock.held(d / LOCK_FILE):
        CellLock._take_over(d / LOCK_FILE)  # a dead runner's lock: a done cell is never started again
    _write_json(self.root / "grid.json", {"cells": [c.run_id for c in self.cells], "written": _stamp()})

  def _on_signal(self, signum, frame) -> None:
    self.stop_requested += 1

  def run(self) -> dict[str, int]:
    self._prepare()
    queue = [c for c in self.cells if result_status(self.root / c.run_id) != "done"]
    self._say(f"{len(self.cells)} cells, {len(self.cells) - len(queue)} done, {len(queue)} to run on "
              f"{self.backend.name} x{self.parallel} under {self.root}")
    previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    active: dict[str, tuple] = {}  # run_id -> (cell, handle, lock, started, slot)
    failures: dict[str, int] = {}
    preemptions: dict[str, int] = {}
    busy_elsewhere: set[str] = set()
    terminated = False
    try:
      while queue or active:
        if self.stop_requested and not terminated:
          self._say(f"stopping: SIGTERM to {len(active)} run(s), which checkpoint and exit")
          for _, handle, *_ in active.values():
            self.backend.terminate(handle)
          queue, terminated = [], True
        if self.stop_requested > 1:
          for _, handle, *_ in active.values():
            self.backend.kill(handle)
        while queue and len(active) < self.parallel and not self.stop_requested:
          cell = queue.pop(0)
          slot = min(set(range(self.parallel)) - {a[4] for a in active.values()})
          started = self._start(cell, slot, busy_elsewhere)
          if started:
            active[cell.run_id] = started
        for run_id, (cell, handle, lock, t0, _) in list(active.items()):
          rc = self.backend.poll(handle)
          if rc is None:
            lock.heartbeat()
            continue
          del active[run_id]
          if self._finish(cell, rc, lock, t0, failures, preemptions) == "retry":
            queue.append(cell)
        if active or queue:
          time.sleep(self.poll_seconds)
    finally:
      for cell, handle, lock, *_ in active.values():  # only on an exception in this loop
        self.backend.kill(handle)
        update_status(self.root / cell.run_id, status="pending", note="runner crashed")
        lock.release()
      for s, h in previous.items():
        signal.signal(s, h)
      self.backend.close()
    counts = summarize(self.root, [c.run_id for c in self.cells])
    self._say("finished: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
              + (f"; {len(busy_elsewhere)} owned by another runner" if busy_elsewhere else ""))
    return counts

  def _start(self, cell: Cell, slot: int, busy_elsewhere: set):
    d = self.root / cell.run_id
    lock = CellLock.acquire(d / LOCK_FILE)
    if lock is None:
      busy_elsewhere.add(cell.run_id)
      self._say(f"skip {cell.run_id}: another live runner owns it")
      return None
    if result_status(d) == "done":  # finished since we looked (another runner)
      update_status(d, status="done")
      lock.release()
      return None
    status = _read_json(d / STATUS_FILE) or {}
    attempt = int(status.get("attempts", 0)) + 1
    command = self.backend.command(cell, str(d.resolve()))
    ckpt = d / "checkpoints"
    resumed = ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir())
    handle = self.backend.start(cell, str(d.resolve()), str(d / LOG_FILE), slot)
    lock.set_child(handle.pid)
    update_status(d, status="running", attempts=attempt, started=_stamp(), finished=None, command=command,
                  cwd=os.getcwd(), backend=self.backend.name, runner_pid=os.getpid(), child_pid=handle.pid)
    self._say(f"start {cell.run_id} (attempt {attempt}{', resuming' if resumed else ''})")
    return cell, handle, lock, time.time(), slot

  def _finish(self, cell: Cell, rc: int, lock, t0: float, failures: dict, preemptions: dict) -> str:
    d = self.root / cell.run_id
    verdict = result_status(d)
    took = f"{time.time() - t0:.0f}s"
    if rc == 0 and verdict == "done":
      result = _read_json(d / "result.json") or {}
      update_status(d, status="done", finished=_stamp(), returncode=rc, result_status=verdict)
      self._say(f"done {cell.run_id} in {took}: val loss {result.get('eval', {}).get('val')}")
      out = "done"
    elif self.stop_requested or (rc == 0 and verdict == "preempted"):
      preemptions[cell.run_id] = preemptions.get(cell.run_id, 0) + 1
      update_status(d, status="pending", finished=_stamp(), returncode=rc, result_status=verdict,
                    note="preempted; resumes from its last checkpoint")
      self._say(f"preempted {cell.run_id} after {took}")
      out = "retry" if not self.stop_requested and preemptions[cell.run_id] < self.MAX_PREEMPTIONS else "pending"
    else:
      failures[cell.run_id] = failures.get(cell.run_id, 0) + 1
      status = _read_json(d / STATUS_FILE) or {}
      retry = rc != 2 and failures[cell.run_id] <= self.retries
      update_status(d, status="pending" if retry else "failed", finished=_stamp(), returncode=rc,
                    result_status=verdict, failures=int(status.get("failures", 0)) + 1, error=_log_tail(d))
      self._say(f"failed {cell.run_id} (exit {rc}) after {took}: {_log_tail(d, 1)}"
                + ("; retrying from its last checkpoint" if retry else ""))
      out = "retry" if retry else "failed"
    lock.release()
    return out


if __name__ == "__main__":  # the exec shim: python -m nsl.scaling.backends PROGRAM ARGS...
  _child_setup()
  os.execvp(sys.argv[1], sys.argv[1:])
