"""Per-cell locks: which runner owns a grid cell, and taking over the cells of dead ones.

A cell's lock file holds the owning runner's pid, host and process start time, and the child's;
a runner whose process is gone (or whose heartbeat is older than STALE_SECONDS, for other hosts)
has left a stale lock, which the next runner takes over after stopping any leftover child.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

from nsl.procs import alive, proc_start

STALE_SECONDS = 300.0  # a lock from another host without a heartbeat for this long is stale
CHILD_GRACE_SECONDS = 120.0  # time a leftover child gets to checkpoint after SIGTERM


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
        if not cls.take_over(path):
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
  def take_over(cls, path: Path) -> bool:
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
