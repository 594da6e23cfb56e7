"""Orbax checkpoints: train state + the data position + run metadata (docs/guide/determinism.md,
docs/guide/training.md#checkpoints, docs/guide/training.md#elastic-resume).

Saves are asynchronous; Orbax writes each step to a temporary directory and renames it when
complete, so `latest_step` only ever names a finished checkpoint.

The data position is global: every process's iterator batches the same global indices and only
then takes its rows (nsl/data/pipeline.py), so its state (`{"next_index": global batches
consumed}`) is the same on every process and says which examples the whole run has seen. It is
snapshotted at save time into the metadata (`data_state`), and a restore onto any process or
device count sets every process's iterator from it, each then reading its own rows of the
following global batches. Checkpoints of older nsl hold Grain's per-process files
(`data/process_P-of-N.json`) instead; those restore with the same process count only.

Each step's metadata also holds a fingerprint of every array (`nsl.fingerprint`), checked when
the step is restored: an array changed on disk (a flipped byte, which Orbax would read as another
number) makes the step damaged like a truncated file.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import os
import socket
import sys
import time
from typing import Any, Callable

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

import nsl
from nsl import fingerprint, lease, storage
from nsl.errors import NslError, disk_full_cause, disk_full_error, warn


COMMIT_FILE = "commit_success.txt"  # Orbax's mark of a finished step in object storage


def global_data_state(data_iterator) -> dict[str, Any]:
  """The iterator's state, checked to be the same on every process (it is a global position; a
  process that disagrees would make a restore onto another process count skip or repeat rows)."""
  state = data_iterator.get_state()
  state = json.loads(state) if isinstance(state, (bytes, str)) else state
  if jax.process_count() > 1:
    digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).digest()[:8]
    every = multihost_utils.process_allgather(np.frombuffer(digest, np.uint8))
    if not (np.asarray(every) == np.asarray(every)[0]).all():
      # A bug in a pipeline, not a user's mistake: a traceback, not one line.
      raise RuntimeError(f"the processes' data iterators disagree on the position at this save ({state} on "
                         f"process {jax.process_index()}); the pipeline is not batching global indices")
  return state


class _DiskFullLogs(logging.Filter):
  """Drops Orbax's absl ERROR records of a full disk: its background save threads log each failure
  with a traceback (four of them, ~300 lines) before the save's error reaches nsl, which reports
  it in one line naming the directory and the bytes (`Checkpointer.wait`). Other records pass."""

  def filter(self, record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None and disk_full_cause(exc) is not None:
      return False
    return "No space left on device" not in record.getMessage()


logging.getLogger("absl").addFilter(_DiskFullLogs())


class _AbandonedReads(logging.Filter):
  """Drops asyncio's "Task/Future exception was never retrieved" for the array reads Orbax started
  beside one that failed on a damaged or mismatched step (`async_deserialize`, TensorStore's
  DATA_LOSS on an OCDBT manifest): the restore's failure is already reported in one line; collected
  later, each abandoned read would print its traceback. Every other asyncio record passes."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    unretrieved = message.startswith(("Task exception was never retrieved", "Future exception was never retrieved"))
    return not (unretrieved and any(m in message for m in ("async_deserialize", "DATA_LOSS", "ocdbt")))


logging.getLogger("asyncio").addFilter(_AbandonedReads())


class Checkpointer:
  def __init__(self, directory: str, keep: int, async_save: bool = True):
    self.directory = storage.resolve(directory)  # a local directory or gs://bucket/...
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    if storage.is_remote(self.directory) and jax.process_index() == 0:
      self._remove_unfinished()
    if jax.process_count() > 1 and storage.is_remote(self.directory):
      multihost_utils.sync_global_devices("nsl_ckpt_unfinished_removed")
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def _remove_unfinished(self) -> None:
    """In a bucket Orbax writes a step in place and marks it done with commit_success.txt (no
    atomic rename there); a step without it is a save cut short by a kill, as a local
    `<step>.orbax-checkpoint-tmp-*` directory is: removed quietly, not reported as damage."""
    for name in storage.listdir(self.directory) if storage.isdir(self.directory) else []:
      step_dir = storage.join(self.directory, name)
      if name.isdigit() and not storage.isfile(storage.join(step_dir, COMMIT_FILE)):
        storage.rmtree(step_dir)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def _disk_full(self, e: BaseException, state=None):
    cause = disk_full_cause(e)
    if cause is None:
      return None
    needed = getattr(self, "_state_bytes", None)
    return disk_full_error(cause, where=self.directory, needed=needed)

  def save(self, step: int, state, data_iterator, metadata: dict[str, Any], force: bool = False) -> bool:
    meta = dict(metadata, step=int(step), process_count=jax.process_count(), device_count=jax.device_count(),
                nsl_version=nsl.__version__)
    if data_iterator is not None:  # a copy taken now: the live iterator moves on during an async save
      meta["data_state"] = global_data_state(data_iterator)
    meta["fingerprint"] = fingerprint.of(state)  # checked on restore (`check_fingerprint`)
    args = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
    self._state_bytes = sum(int(getattr(x, "nbytes", 0)) for x in jax.tree.leaves(state))
    try:
      return self.manager.save(step, args=ocp.args.Composite(**args), force=force)
    except Exception as e:
      full = self._disk_full(e)
      if full is not None:
        raise full from e
      raise

  def restore_latest(self, abstract_state, data_iterator=None,
                     check: Callable[[dict[str, Any]], None] | None = None):
    """(step, state, meta) of the newest checkpoint that restores, or None when there is none.

    A damaged step (missing or truncated files, an empty directory) is set aside as
    `<step>.damaged` with a one-line warning and the next older one is tried; when every step is
    damaged, one NslError names the directory. `check(meta)` runs first on each step and may
    raise ConfigError (a resume with an incompatible config), which is not damage.
    """
    steps = self._step_dirs()
    damaged = []
    for step in sorted(steps, reverse=True):
      try:
        meta = self.metadata(step)
        if check is not None:
          check(meta)
        state, meta = self.restore(step, abstract_state, data_iterator)
      except NslError:
        raise
      except Exception as e:  # Orbax / Grain / JSON errors of a damaged step
        full = self._disk_full(e)
        if full is not None:
          raise full from e
        reason = _reason(e)
        damaged.append(step)
        older = [s for s in steps if s < step]
        warn(f"checkpoint {storage.join(self.directory, str(step))} is damaged ({reason}); "
             + (f"falling back to step {max(older)}" if older else "no older checkpoint")
             + f"; it is kept as {step}.damaged")
        self._set_aside(step)
        continue
      return step, state, meta
    if damaged:
      raise NslError(f"every checkpoint in {self.directory} is damaged (steps {sorted(damaged)}, kept as "
                     "<step>.damaged); delete that directory to train from scratch, or use a new --workdir")
    return None

  def _step_dirs(self) -> list[int]:
    """Step numbers of the directories here, finished or not (an empty or half-deleted step
    directory is damage to report, not something to silently skip)."""
    steps = set(self.all_steps())
    try:
      names = storage.listdir(self.directory)
    except OSError:
      names = []
    steps.update(int(n) for n in names if n.isdigit() and storage.isdir(storage.join(self.directory, n)))
    return sorted(steps)

  def _set_aside(self, step: int) -> None:
    if jax.process_index() == 0:
      src = storage.join(self.directory, str(step))
      dst = storage.join(self.directory, f"{step}.damaged")
      if storage.exists(dst):
        dst = f"{dst}-{int(time.time())}"
      try:
        storage.rename(src, dst)
      except OSError:
        pass
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices(f"nsl_ckpt_set_aside_{step}")
    self.manager.reload()

  def restore(self, step: int, abstract_state, data_iterator=None):
    """Restores the state, resharded onto `abstract_state`'s shardings (this run's mesh, whatever
    the process and device counts that wrote it), and sets the iterator to the saved global
    position (module docstring)."""
    meta = self.metadata(step)
    per_process = data_iterator is not None and "data_state" not in meta  # an older nsl's checkpoint
    if per_process and meta.get("process_count", 1) != jax.process_count():
      raise NslError(f"checkpoint {self.directory}/{step} was written by an older nsl with a data position per "
                     f"process ({meta.get('process_count')} processes; this run has {jax.process_count()}); "
                     f"resume it once with {meta.get('process_count')} processes, whose next checkpoint "
                     "can then move to any count")
    args = {"state": ocp.args.StandardRestore(abstract_state)}
    if per_process:
      args["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    restored = self.manager.restore(step, args=ocp.args.Composite(**args))
    check_fingerprint(meta, restored["state"])
    if data_iterator is not None and not per_process:
      data_iterator.set_state(meta["data_state"])
      getattr(data_iterator, "start_prefetch", lambda: None)()
    return restored["state"], meta

  def metadata(self, step: int) -> dict[str, Any]:
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def wait(self) -> None:
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      full = self._disk_full(e)
      if full is not None:
        raise full from e
      raise

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self.manager.close()


def step_dirs(directory: str) -> list[int]:
  """The step numbers of `directory`'s step folders, newest first, without Orbax (a local
  `<step>.orbax-checkpoint-tmp-*` folder is not one; in a bucket an unfinished step has no
  commit_success.txt). [] when `directory` cannot be listed."""
  try:
    names = storage.listdir(directory) if storage.isdir(directory) else []
    steps = [int(n) for n in names if n.isdigit()]
    if storage.is_remote(directory):
      steps = [s for s in steps if storage.isfile(storage.join(directory, str(s), COMMIT_FILE))]
  except Exception:  # a missing bucket, no credentials: reported by the checks that need it
    return []
  return sorted(steps, reverse=True)


def saved_config(directory: str) -> dict[str, Any] | None:
  """The config recorded by the newest step of `directory` whose metadata reads (a damaged newest
  step falls back as `Checkpointer.restore_latest` does), read as JSON without Orbax; None when no
  step has one."""
  for step in step_dirs(directory):
    try:
      config = json.loads(storage.read_text(storage.join(directory, str(step), "meta", "metadata"))).get("config")
    except (OSError, ValueError, AttributeError):
      continue
    if isinstance(config, dict):
      return config
  return None


def restore_params(path: str, abstract_state, flag: str = "--restore_from", config=None):
  """Parameters of the latest checkpoint under `path` (a run's workdir or its checkpoints dir).
  `flag` is the command-line option that named `path`, for the error messages. A reader of a run
  (an evaluation, `--workdir`) falls back past a damaged newest step with one warning; a new run
  started `--restore_from` it does not: it would train from weights other than the ones named, so
  that is one error line saying which step is damaged and which is intact. A checkpoint of another
  architecture is named from its metadata before any array is read (`architecture_difference`,
  with `config`'s fields that differ from the run's)."""
  directory = path if storage.basename(path) == "checkpoints" else storage.join(path, "checkpoints")
  storage.check_bucket(path, flag)
  if not storage.isdir(directory):
    raise NslError(f"{flag}={path!r}: no checkpoints directory at {directory}")
  with quiet_orbax():
    manager = ocp.CheckpointManager(storage.resolve(directory), options=ocp.CheckpointManagerOptions(read_only=True),
                                    item_handlers=_item_handlers())
  try:
    steps = sorted(manager.all_steps(), reverse=True)
    if not steps:
      raise NslError(f"{flag}={path!r}: no complete checkpoint in {directory}")
    other = architecture_difference(manager, steps[0], abstract_state, config)
    if other is not None:
      raise NslError(f"{flag}={path!r}: checkpoint {storage.join(directory, str(steps[0]))} is of another "
                     f"architecture ({other}); use a run of the same family and model sizes")
    return _restore_newest(manager, steps, abstract_state, path, directory, flag)
  finally:
    manager.close()


def _restore_newest(manager, steps, abstract_state, path, directory, flag):
  """restore_params' walk from the newest step down (its docstring)."""
  mismatch, first_failure = None, None
  for step in steps:  # the newest that restores; a damaged one is skipped with a warning
    try:
      restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                                               meta=ocp.args.JsonRestore()))
      check_fingerprint(restored["meta"], restored["state"])
      if step != steps[0] and flag == "--restore_from":
        newest = storage.join(directory, str(steps[0]))
        raise NslError(f"{flag}={path!r}: its newest checkpoint {newest} is damaged "
                       f"({first_failure}); step {step} is intact: move {newest} "
                       "aside to start from it")
      if mismatch is not None:  # an older step fits this model, so the newer one was damage
        warn(f"{flag}: checkpoint {storage.join(directory, str(mismatch[0]))} is damaged ({mismatch[1]}); "
             f"used step {step}")
      return restored["state"].params, step
    except NslError:
      raise
    except Exception as e:
      reason = _reason(e)
      first_failure = first_failure or reason
      # Without its _METADATA Orbax reads a step's tree as a different structure: damage, not
      # another architecture.
      if _is_shape_mismatch(e) and storage.isfile(storage.join(directory, str(step), "state", "_METADATA")):
        mismatch = mismatch or (step, reason)
      elif flag != "--restore_from":  # there, an older intact step is the error above
        warn(f"{flag}: checkpoint {storage.join(directory, str(step))} is damaged ({reason}); trying an older one")
  if mismatch is not None:
    raise NslError(f"{flag}={path!r}: checkpoint step {mismatch[0]} does not match this model "
                   f"({mismatch[1]}); use a run of the same architecture")
  fix = "; name another run, or start without --restore_from" if flag == "--restore_from" else ""
  raise NslError(f"{flag}={path!r}: every checkpoint in {directory} is damaged (steps {sorted(steps)}){fix}")


def _item_handlers():
  """The handlers of a step's two items, so a read-only manager can read their metadata."""
  return {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}


def _param_shapes(tree) -> dict[str, tuple]:
  return {"/".join(str(getattr(k, "key", k)) for k in p): tuple(getattr(leaf, "shape", ()))
          for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def architecture_difference(manager, step: int, abstract_state, config=None) -> str | None:
  """Why checkpoint `step` cannot hold this model's parameters, read from its metadata alone: the
  first parameter whose shape differs or that one side lacks, and the family and model fields of
  its config that differ from `config`'s. None when the shapes agree, or when the metadata cannot
  be read (damage, which reading the arrays reports)."""
  try:
    with quiet_orbax():  # a step without its tree metadata is an absl warning, then damage below
      there = _param_shapes(manager.item_metadata(step)["state"]["params"])
  except Exception:
    return None
  here = _param_shapes(abstract_state.params)
  if there == here:
    return None
  name = next(n for n in sorted(set(there) | set(here)) if there.get(n) != here.get(n))
  shape = lambda d: str(list(d[name])) if name in d else "absent"
  why = f"parameter {name} is {shape(there)} there, {shape(here)} here"
  if config is not None:
    from nsl import config as nsl_config
    try:
      saved = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"].get("config", {})
    except Exception:
      saved = {}
    fields = [d for d in nsl_config.resume_differences(saved, nsl_config.to_dict(config))
              if d[0] == "family" or d[0].split(".")[0] in ("model", config.family)]
    named = [f"config.{f} is {was!r} there, {now!r} here" for f, was, now in fields[:3]]
    why = "; ".join(named + [why])
  return why


@contextlib.contextmanager
def quiet_orbax():
  """Orbax's absl warnings off: a read-only manager announces three option adjustments that say
  nothing to a user, and would print before an evaluation's one error line."""
  logger = logging.getLogger("absl")
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


def state_digest(state) -> str:
  """`sha256:<hex>` over every leaf of `state` (a TrainState: step, parameters, optimizer state,
  non-finite run) in tree order: its path, dtype, shape and bytes. Two runs with the
  same digest hold the same bits (docs/guide/determinism.md). Every process must call it: a leaf
  spread over processes is gathered one at a time."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      leaf = multihost_utils.process_allgather(leaf, tiled=True)
    x = np.ascontiguousarray(np.asarray(leaf))  # the host's byte order: little-endian on every JAX host
    h.update(f"{jax.tree_util.keystr(path)}:{x.dtype.name}:{x.shape};".encode())
    h.update(x.tobytes())
  return "sha256:" + h.hexdigest()


def _drop_closed_loop_noise(previous=sys.unraisablehook):
  """TensorStore's callbacks for a read that failed on a damaged step (a truncated OCDBT manifest)
  can fire after Orbax closed their event loop; Python then prints 'Exception ignored ...
  RuntimeError: Event loop is closed' tracebacks at garbage collection. And the array reads Orbax
  started beside one that failed (a shape of another architecture, a damaged array) are left
  suspended; closed at collection, each turns its GeneratorExit into an Exception printing a whole
  TensorStore spec (thousands of lines for one model). The failure was already reported in one
  line, so only those two are dropped; every other unraisable error still prints."""

  def hook(unraisable):
    e = unraisable.exc_value
    if isinstance(e, RuntimeError) and str(e) == "Event loop is closed":
      return
    if inspect.iscoroutine(unraisable.object) and isinstance(e.__cause__ or e.__context__, GeneratorExit):
      return  # a read abandoned by a failed restore, closed at collection (Orbax wraps its GeneratorExit)
    previous(unraisable)

  return hook


sys.unraisablehook = _drop_closed_loop_noise()


class ChangedArray(Exception):
  """A restored array that differs from the fingerprint saved with it: damage (not an NslError, so
  the readers set the step aside and try an older one)."""


def check_fingerprint(meta: dict[str, Any], state) -> None:
  """ChangedArray naming the first array of `state` whose fingerprint is not the one the step's
  metadata recorded (a checkpoint of an nsl from before fingerprints has none: nothing to check)."""
  saved = meta.get("fingerprint")
  if saved:
    changed = fingerprint.first_difference(saved, fingerprint.of(state))
    if changed is not None:
      raise ChangedArray(f"array {changed} differs from the fingerprint saved with it (changed on disk)")


def _reason(e: BaseException) -> str:
  """A failed read in a few words: its innermost cause (Orbax wraps TensorStore's error, which
  names the array and the file, in one that prints the whole TensorStore spec)."""
  while e.__cause__ is not None:
    e = e.__cause__
  return f"{type(e).__name__}: {' '.join(str(e).split())[:160]}"


def _is_shape_mismatch(e: BaseException) -> bool:
  text = str(e).lower()
  return isinstance(e, (ValueError, KeyError)) and ("shape" in text or "structure" in text or "tree" in text
                                                    or "missing" in text or "key" in text)


class WorkdirLock:
  """`WORKDIR/.nsl.lock`: the training process that owns a workdir, as a lease (`nsl.lease`)
  renewed by a thread while it trains.

  A second trainer on the same workdir refuses with one line naming the holder. A lock whose
  holder is gone is taken over: at once when the holder ran on this host (pid dead or reused), and
  once its lease lapses when it ran on another (a preempted TPU host, a requeued Slurm job whose
  rank 0 lands on another node): a trainer that finds such a lease waits for it, at most one lease.
  In a gs:// workdir the lock is an object written with GCS's create-only precondition, so of two
  trainers one wins; other object stores have no such write and are refused
  (docs/guide/storage.md#the-workdir-lock).
  """

  NAME = lease.RUN_LOCK
  SECONDS = lease.DEFAULT_SECONDS

  def __init__(self, held: "lease.Lease"):
    self.path, self.info, self.held = held.path, held.info, held
    self.keeper = lease.Keeper(held)
    self.keeper.start()

  @classmethod
  def acquire(cls, workdir: str, seconds: float | None = None) -> "WorkdirLock":
    path = storage.join(storage.resolve(workdir), cls.NAME)
    seconds = seconds or float(os.environ.get("NSL_LEASE_SECONDS") or cls.SECONDS)
    deadline = time.time() + seconds + 5
    while True:
      held = lease.Lease.acquire(path, seconds, reentrant=True)
      if held is not None:
        return cls(held)
      holder, _ = lease.read(path)
      holder = holder or {}
      remote_holder = holder.get("host") != socket.gethostname()
      if not remote_holder or time.time() > deadline:
        raise NslError(f"--workdir={workdir} is in use by another trainer (pid {holder.get('pid')} on "
                       f"{holder.get('host')}, lock {path}); wait for it to finish, stop it, or use another "
                       "--workdir (delete the lock only if that process is gone)")
      wait = min(max(float(holder.get("expires") or 0) - time.time(), 1.0), deadline - time.time()) + 0.5
      print(f"nsl: --workdir={workdir} is leased by pid {holder.get('pid')} on {holder.get('host')}; "
            f"waiting {wait:.0f} s for the lease to lapse", file=sys.stderr, flush=True)
      time.sleep(max(wait, 0.5))

  def release(self) -> None:
    self.keeper.stop()
    self.held.release()

