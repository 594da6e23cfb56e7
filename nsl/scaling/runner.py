"""The grid runner: a grid's unfinished cells through a backend, resumable across kills
(docs/papers/scaling_laws.md#practice).

`Runner(cells, root, backend).run()` gives every cell ROOT/<run_id>/ (`nsl.scaling.cells`; the
root a local directory or a gs:// prefix), owns it through its claim (`nsl.scaling.locks`) while
the backend (`nsl.scaling.backends`) runs the cell's processes, and records each attempt in
status.json. Before any cell starts, the grid's data is prepared once (`nsl.scaling.griddata`).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time

from nsl import lease, storage
from nsl.errors import ConfigError
from nsl.scaling import griddata
from nsl.scaling.cells import (CELL_FILE, LOCK_FILE, STATUS_FILE, Cell, log_tail, read_json, result_status, stamp,
                               summarize, update_status, write_json)
from nsl.scaling.locks import CellLock


LOST = 75  # a backend's status for a cell whose host or slice went away (preempted): not a failure
WAIT = "wait"  # `_start`: not now, the run is still held by its last attempt's trainer


class Runner:
  """Runs a grid's unfinished cells, `parallel` at a time, each with up to 1 + `retries` failed
  attempts (a cell whose launcher exits with status 2, a user error, is not retried: it would
  fail the same way). A run that ends "preempted" is restarted without counting as a failure."""

  MAX_PREEMPTIONS = 50

  def __init__(self, cells: list[Cell], root: str, backend, parallel: int = 1, retries: int = 2,
               poll_seconds: float = 1.0, out=sys.stdout):
    if parallel < 1 or retries < 0:
      raise ConfigError(f"--parallel={parallel} must be >= 1 and --retries={retries} >= 0")
    self.cells, self.root, self.backend = cells, storage.resolve(root), backend
    self.parallel, self.retries, self.poll_seconds, self.out = parallel, retries, poll_seconds, out
    self.stop_requested = 0
    self.placed: dict[str, tuple] = {}  # run_id -> the grid data's placement overrides
    self.waiting: set[str] = set()  # cells whose last trainer still holds their run

  def _dir(self, run_id: str) -> str:
    return storage.join(self.root, run_id)

  def _say(self, msg: str) -> None:
    print(f"[grid {stamp()}] {msg}", file=self.out, flush=True)

  def _prepare(self) -> None:
    storage.check_bucket(self.root, "--root")
    storage.makedirs(self.root)
    for cell in self.cells:
      d = self._dir(cell.run_id)
      storage.makedirs(d)
      if not storage.isfile(storage.join(d, CELL_FILE)):
        write_json(storage.join(d, CELL_FILE), cell.to_json())
      status = read_json(storage.join(d, STATUS_FILE))
      if status is None:
        update_status(d, run_id=cell.run_id, status="pending", attempts=0, failures=0, created=stamp())
      done = result_status(d) == "done"
      if done and (status or {}).get("status") != "done":
        update_status(d, status="done")  # finished after its runner died
      if done and storage.exists(storage.join(d, LOCK_FILE)) and not CellLock.held(storage.join(d, LOCK_FILE)):
        CellLock.take_over(storage.join(d, LOCK_FILE))  # a dead runner's claim: a done cell is never started again
    write_json(storage.join(self.root, "grid.json"), {"cells": [c.run_id for c in self.cells], "written": stamp()})
    todo = [c for c in self.cells if result_status(self._dir(c.run_id)) != "done"]
    self.placed, failed = griddata.prepare(todo, self.root, getattr(self.backend, "shares_disk", False), self._say)
    for run_id, why in failed.items():
      update_status(self._dir(run_id), status="failed", finished=stamp(), error=why)
    return set(failed)

  def _on_signal(self, signum, frame) -> None:
    self.stop_requested += 1

  def _note(self, run_id: str, handle, notes: dict) -> None:
    """Why a started cell's job is not running, from the backend's optional `waiting` (a held Slurm
    job waits for a release however long): said once each time it changes, kept in status.json's
    `note` for `grid status`."""
    waiting = getattr(self.backend, "waiting", None)
    note = waiting(handle) if waiting else None
    if note != notes.get(run_id):
      notes[run_id] = note
      if note:
        self._say(f"{run_id}: {note}")
      update_status(self._dir(run_id), note=note)

  def run(self) -> dict[str, int]:
    no_data = self._prepare()
    queue = [c for c in self.cells if result_status(self._dir(c.run_id)) != "done" and c.run_id not in no_data]
    self._say(f"{len(self.cells)} cells, {len(self.cells) - len(queue)} done, {len(queue)} to run on "
              f"{self.backend.name} x{self.parallel} under {self.root}")
    previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    active: dict[str, tuple] = {}  # run_id -> (cell, handle, lock, started, slot)
    failures: dict[str, int] = {}
    preemptions: dict[str, int] = {}
    notes: dict[str, str | None] = {}  # run_id -> why its started job is not running (`_note`)
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
          cell = self._next_ready(queue, active)
          if cell is None:  # the rest wait for cells still running
            break
          slot = min(set(range(self.parallel)) - {a[4] for a in active.values()})
          started = self._start(cell, slot, busy_elsewhere)
          if started == WAIT:  # its last attempt's trainer still holds the run: try it again later
            queue.append(cell)
            break
          if started:
            active[cell.run_id] = started
        for run_id, (cell, handle, lock, t0, _) in list(active.items()):
          rc = self.backend.poll(handle)
          if rc is None:
            if not lock.heartbeat() and not self.stop_requested:
              self._say(f"lost the claim on {run_id} (another runner took it over): stopping it here")
              self.backend.terminate(handle)
            self._note(run_id, handle, notes)
            continue
          del active[run_id]
          update_status(self._dir(run_id), job=self.backend.describe(handle))  # where it ran, as it ended
          if self._finish(cell, rc, lock, t0, failures, preemptions) == "retry":
            queue.append(cell)
        if active or queue:
          time.sleep(self.poll_seconds)
    finally:
      for cell, handle, lock, *_ in active.values():  # only on an exception in this loop
        self.backend.kill(handle)
        update_status(self._dir(cell.run_id), status="pending", note="runner crashed")
        lock.release()
      for s, h in previous.items():
        signal.signal(s, h)
      self.backend.close()
    counts = summarize(self.root, [c.run_id for c in self.cells])
    self._say("finished: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
              + (f"; {len(busy_elsewhere)} owned by another runner" if busy_elsewhere else ""))
    return counts

  def _next_ready(self, queue: list[Cell], active: dict) -> Cell | None:
    """Takes the first queued cell whose required cells (`Cell.requires`) are done; a cell whose
    requirement can no longer finish (failed, not queued, no live runner on it) fails now."""
    i = 0
    while i < len(queue):
      cell = queue[i]
      waiting = [r for r in cell.requires if result_status(self._dir(r)) != "done"]
      if not waiting:
        return queue.pop(i)
      coming = {c.run_id for c in queue} | set(active)
      lost = [r for r in waiting if r not in coming and not CellLock.held(storage.join(self._dir(r), LOCK_FILE))]
      if lost:
        queue.pop(i)
        state = (read_json(storage.join(self._dir(lost[0]), STATUS_FILE)) or {}).get("status", "missing")
        why = f"needs cell {lost[0]} ({state}, not done); rerun the grid once it is fixed"
        update_status(self._dir(cell.run_id), status="failed", finished=stamp(), error=why)
        self._say(f"failed {cell.run_id}: {why}")
        continue
      i += 1
    return None

  def _start(self, cell: Cell, slot: int, busy_elsewhere: set):
    d = self._dir(cell.run_id)
    lock = CellLock.acquire(storage.join(d, LOCK_FILE))
    if lock is None:
      busy_elsewhere.add(cell.run_id)
      self._say(f"skip {cell.run_id}: another live runner owns it")
      return None
    if result_status(d) == "done":  # finished since we looked (another runner)
      update_status(d, status="done")
      lock.release()
      return None
    if lease.held(storage.join(d, lease.RUN_LOCK)):
      # A lost host's trainer that is still saving and exiting (or whose lease has not lapsed yet):
      # a new attempt started now would refuse the run in use (exit 2, never retried).
      lock.release()
      if cell.run_id not in self.waiting:
        self.waiting.add(cell.run_id)
        self._say(f"waiting for {cell.run_id}'s last trainer to release the run before it starts again")
      return WAIT
    self.waiting.discard(cell.run_id)
    status = read_json(storage.join(d, STATUS_FILE)) or {}
    attempt = int(status.get("attempts", 0)) + 1
    placed = dataclasses.replace(cell, overrides=cell.overrides + self.placed.get(cell.run_id, ()))
    ckpt = storage.join(d, "checkpoints")
    resumed = storage.isdir(ckpt) and any(n.isdigit() for n in storage.listdir(ckpt))
    handle = self.backend.start(placed, d, slot)
    lock.set_child(getattr(handle, "pid", None))
    update_status(d, status="running", attempts=attempt, started=stamp(), finished=None, note=None,
                  command=placed.launch_args(d), backend=self.backend.name, job=self.backend.describe(handle),
                  runner_pid=os.getpid(), runner_host=os.uname().nodename)
    self._say(f"start {cell.run_id} (attempt {attempt}{', resuming' if resumed else ''})")
    return cell, handle, lock, time.time(), slot

  def _finish(self, cell: Cell, rc: int, lock, t0: float, failures: dict, preemptions: dict) -> str:
    d = self._dir(cell.run_id)
    verdict = result_status(d)
    took = f"{time.time() - t0:.0f}s"
    if rc == 0 and verdict == "done":
      result = read_json(storage.join(d, "result.json")) or {}
      update_status(d, status="done", finished=stamp(), returncode=rc, result_status=verdict)
      self._say(f"done {cell.run_id} in {took}: val loss {result.get('eval', {}).get('val')}")
      out = "done"
    elif self.stop_requested or (rc == 0 and verdict == "preempted") or rc == LOST:
      preemptions[cell.run_id] = preemptions.get(cell.run_id, 0) + 1
      update_status(d, status="pending", finished=stamp(), returncode=rc, result_status=verdict,
                    note="preempted; resumes from its last checkpoint")
      self._say(f"preempted {cell.run_id} after {took}")
      out = "retry" if not self.stop_requested and preemptions[cell.run_id] < self.MAX_PREEMPTIONS else "pending"
    else:
      failures[cell.run_id] = failures.get(cell.run_id, 0) + 1
      status = read_json(storage.join(d, STATUS_FILE)) or {}
      retry = rc != 2 and failures[cell.run_id] <= self.retries
      update_status(d, status="pending" if retry else "failed", finished=stamp(), returncode=rc,
                    result_status=verdict, failures=int(status.get("failures", 0)) + 1, error=log_tail(d))
      self._say(f"failed {cell.run_id} (exit {rc}) after {took}: {log_tail(d, 1)}"
                + ("; retrying from its last checkpoint" if retry else ""))
      out = "retry" if retry else "failed"
    lock.release()
    return out
