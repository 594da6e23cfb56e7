"""Kills that land where a test's name says they do (issue #56, docs/guide/training.md#checkpoints).

A test of "SIGKILL during an asynchronous save" polls for a save in flight and then kills; if the
save committed in the gap between the poll and the kill, the test passes under a false name. So
the kill is proven after the fact, as tests/data/test_prepare_resume.py proves its kill from the
journal: with the process dead, the save that triggered it must still be unfinished and its step
must not be a finished checkpoint. A kill that landed after the commit is retried on a fresh launch
of the same run (which resumes from it); every try missing fails the test.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

# Polling, and the kill it triggers, lag the save by a few milliseconds at most; a save commits
# after tens of milliseconds at the least, so a miss is rare and three in a row are a broken test.
ATTEMPTS = 3


def kill_group(proc) -> None:
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()


def kill_during_save(launch: Callable, unfinished: Callable[[], set], finalized: Callable[[str], bool],
                     timeout: float = 300) -> str:
  """Starts the run with `launch()` (a Popen in its own session) and SIGKILLs its process group the
  moment `unfinished()` (the names of the saves in flight) holds one that was not there before the
  launch (one a previous kill left behind is no sign of a save). Returns that save's name once, the
  process dead, it is still unfinished and `finalized(name)` (its step is a finished checkpoint) is
  False. Fails when the run ends first, when no save starts within `timeout` s, or when every one
  of ATTEMPTS kills landed after its save committed."""
  misses = []
  for _ in range(ATTEMPTS):
    left = unfinished()
    proc = launch()
    deadline = time.time() + timeout
    while not unfinished() - left:
      assert proc.poll() is None, f"the run ended before a save began: {_tail(proc)}"
      assert time.time() < deadline, f"no save began within {timeout} s"
      time.sleep(0.005)
    kill_group(proc)
    seen = unfinished() - left
    cut = sorted(name for name in seen if not finalized(name))
    if cut:
      return cut[0]
    misses.append(sorted(seen))
  raise AssertionError(f"every kill landed after its save committed ({misses}): no kill during a save was tested")


def local_saves(checkpoints) -> tuple[Callable[[], set], Callable[[str], bool]]:
  """`unfinished` and `finalized` for a local checkpoints directory: Orbax writes step N into
  `N.orbax-checkpoint-tmp-*` and renames it to `N` when the save is complete."""
  checkpoints = str(checkpoints)

  def unfinished():
    names = os.listdir(checkpoints) if os.path.isdir(checkpoints) else []
    return {n for n in names if "tmp" in n}

  return unfinished, lambda name: os.path.isdir(os.path.join(checkpoints, name.split(".")[0]))


def bucket_saves(checkpoints: str) -> tuple[Callable[[], set], Callable[[str], bool]]:
  """The same for a gs:// checkpoints prefix: Orbax writes step N in place and marks it done with
  commit_success.txt (nsl.checkpoint.COMMIT_FILE)."""
  from nsl import checkpoint, storage

  done = lambda name: storage.isfile(f"{checkpoints}/{name}/{checkpoint.COMMIT_FILE}")

  def unfinished():
    try:
      names = storage.listdir(checkpoints)
    except OSError:
      return set()
    return {n for n in names if n.isdigit() and not done(n)}

  return unfinished, done


def _tail(proc) -> str:
  out = proc.stdout.read() if proc.stdout else b""
  return (out.decode() if isinstance(out, bytes) else out)[-3000:]
