"""Leases: who owns a grid cell or a run directory, on a local disk or in a bucket
(docs/guide/pods.md#leases).

A lease is one small JSON object (pid, host, process start, an expiry time) created only if
nothing is there: O_EXCL on a local disk, GCS's `ifGenerationMatch=0` in a bucket, so of two
claimants exactly one wins. Its holder renews the expiry while it works. A lease is live while
  - its holder runs on this host (pid and start time match: a dead holder here is taken over at
    once, whatever its expiry), or
  - it is from another host and has not expired: no host can see another's processes, so the
    expiry alone decides, and a preempted host's lease lapses within `seconds`.
A lapsed lease is removed at the generation it was read at (a claimant that took it over
meanwhile keeps its own) and the create-only write is retried. Clocks are assumed to agree to
within a small fraction of a lease (NTP), as every lease system assumes.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from nsl import procs, storage

DEFAULT_SECONDS = 120.0  # a lease's life without renewal: the longest a dead remote holder blocks
RUN_LOCK = ".nsl.lock"  # a run directory's lease (nsl.checkpoint.WorkdirLock), read by the grid runner too


class Lease:
  """A held lease at `path`; `renew()` while working, `release()` when done."""

  def __init__(self, path: str, info: dict, seconds: float):
    self.path, self.info, self.seconds = path, info, seconds
    self.renewed = time.time()

  @staticmethod
  def _me(seconds: float, extra: dict | None) -> dict:
    now = time.time()
    return {"pid": os.getpid(), "host": socket.gethostname(), "start": procs.proc_start(os.getpid()),
            "since": now, "expires": now + seconds, **(extra or {})}

  @classmethod
  def acquire(cls, path: str, seconds: float = DEFAULT_SECONDS, extra: dict | None = None,
              tries: int = 3, reentrant: bool = False) -> "Lease | None":
    """The lease, taking over a lapsed one; None while a live holder has it (`read(path)` says
    who). `reentrant`: a lease this very process holds is handed back (a retried start)."""
    for _ in range(tries):
      info = cls._me(seconds, extra)
      if storage.create_exclusive(path, json.dumps(info)):
        return cls(path, info, seconds)
      holder, version = read(path)
      if holder is not None and live(holder, path):
        if reentrant and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
          return cls(path, holder, seconds)
        return None
      _remove_lapsed(path, version)
    return None

  def renew(self, force: bool = False) -> bool:
    """Pushes the expiry out (at most every quarter lease unless `force`); False if the lease was
    lost (a lapse another claimant took over): the holder must stop using what it guarded."""
    now = time.time()
    if not force and now - self.renewed < self.seconds / 4:
      return True
    holder, _ = read(self.path)
    if holder is None or not self.owns(holder):
      return False
    self.info["expires"] = now + self.seconds
    storage.write_text(self.path, json.dumps(self.info))
    self.renewed = now
    return True

  def owns(self, holder: dict) -> bool:
    return all(holder.get(k) == self.info.get(k) for k in ("pid", "host", "start", "since"))

  def update(self, **fields) -> None:
    """Adds fields (e.g. the child process it started) to the lease object."""
    self.info.update(fields)
    self.renew(force=True)

  def release(self) -> None:
    holder, version = read(self.path)
    if holder is not None and self.owns(holder):
      try:
        storage.remove_version(self.path, version)
      except OSError:
        pass


def read(path: str) -> tuple[dict | None, str | None]:
  """(holder, version): the lease object and its generation; (None, None) when absent or unreadable."""
  try:
    text, version = storage.read_versioned(path)
    info = json.loads(text)
    return (info, version) if isinstance(info, dict) else (None, version)
  except (OSError, ValueError):
    return None, None


def live(info: dict, path: str | None = None) -> bool:
  """Whether the holder described by `info` still holds its lease (module docstring)."""
  if info.get("host") == socket.gethostname():
    return procs.alive(info.get("pid"), info.get("start"))
  expires = info.get("expires")
  if expires is None:  # written before leases expired: its file's age stands in (local disks)
    try:
      expires = os.path.getmtime(path) + DEFAULT_SECONDS if path and not storage.is_remote(path) else 0
    except OSError:
      expires = 0
  return time.time() < float(expires)


def held(path: str) -> bool:
  info, _ = read(path)
  return info is not None and live(info, path)


def _remove_lapsed(path: str, version: str | None) -> None:
  if storage.is_remote(path):
    storage.remove_version(path, version)  # only the generation judged lapsed
    return
  stale = f"{path}.stale{os.getpid()}"
  try:
    os.rename(path, stale)  # atomic: of two claimants taking over, one wins the retry
    os.remove(stale)
  except FileNotFoundError:
    pass


class Keeper(threading.Thread):
  """Renews a lease from a daemon thread (a trainer's steps or compiles can outlast a lease)."""

  def __init__(self, lease: Lease):
    super().__init__(daemon=True, name="nsl-lease")
    self.lease, self.stopped, self.lost = lease, threading.Event(), False

  def run(self) -> None:
    while not self.stopped.wait(self.lease.seconds / 4):
      try:
        if not self.lease.renew(force=True):
          self.lost = True
          return
      except Exception:  # a failed renewal is retried; the lease has three more chances to lapse
        pass

  def stop(self) -> None:
    self.stopped.set()
