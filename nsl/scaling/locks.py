"""Per-cell claims: which runner owns a grid cell, and taking over the cells of dead ones
(docs/guide/pods.md#leases).

A cell's claim is a lease (`nsl.lease`) at ROOT/<run_id>/.runner.lock, local or in a bucket,
renewed by its runner at every poll. A claim whose runner is gone (dead on this host, or a lapsed
lease from any host) is taken over by the next runner, after stopping a leftover child process
of the dead runner when it ran on this host.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from nsl import lease
from nsl.procs import alive

CLAIM_SECONDS = lease.DEFAULT_SECONDS  # a dead remote runner's claim lapses after this long
CHILD_GRACE_SECONDS = 120.0  # time a leftover child gets to checkpoint after SIGTERM


class CellLock:
  """A runner's claim on one cell (see the module docstring)."""

  def __init__(self, held: lease.Lease):
    self.held, self.path = held, held.path

  @classmethod
  def acquire(cls, path: str, seconds: float | None = None) -> "CellLock | None":
    """The claim, taking over a lapsed one; None while a live runner holds it."""
    path = str(path)
    seconds = seconds or float(os.environ.get("NSL_LEASE_SECONDS") or CLAIM_SECONDS)
    holder, _ = lease.read(path)
    if holder is not None and not lease.live(holder, path):
      _stop_leftover_child(holder)
    held = lease.Lease.acquire(path, seconds, extra={"child_pid": None, "child_start": None})
    return cls(held) if held is not None else None

  @staticmethod
  def held(path) -> bool:
    """Whether a live runner holds the claim at `path`."""
    return lease.held(str(path))

  @classmethod
  def take_over(cls, path) -> bool:
    """Removes a lapsed claim (stopping its leftover child); False while it is live."""
    claim = cls.acquire(str(path))
    if claim is None:
      return False
    claim.release()
    return True

  def set_child(self, pid: int | None) -> None:
    from nsl.procs import proc_start
    self.held.update(child_pid=pid, child_start=proc_start(pid) if pid else None)

  def heartbeat(self) -> bool:
    """Renews the claim (at most every quarter lease); False when another runner took it over."""
    try:
      return self.held.renew()
    except OSError:
      return True  # a failed renewal is retried at the next poll

  def release(self) -> None:
    self.held.release()


def _stop_leftover_child(holder: dict) -> None:
  if holder.get("host") == socket.gethostname() and alive(holder.get("child_pid"), holder.get("child_start")):
    stop_process(holder["child_pid"], holder.get("child_start"))


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
