"""Is a process still there? The pid + start-time test that lock files (the workdir lock in
`nsl.checkpoint`, the grid cells' locks in `nsl.scaling.locks`) use to tell a live holder from
a dead one whose pid the kernel may have reused."""

from __future__ import annotations

import os


def proc_start(pid: int) -> str | None:
  """The process's start time (clock ticks since boot) from /proc: tells a reused pid apart."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def alive(pid: int | None, start: str | None = None) -> bool:
  """Whether `pid` runs (not a zombie) and, where known, is the process that started at `start`."""
  if not pid:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  try:
    with open(f"/proc/{pid}/stat") as f:
      if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
        return False
  except (OSError, IndexError):
    return True
  return start is None or proc_start(pid) in (None, start)
