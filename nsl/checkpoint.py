"""Orbax checkpoints: train state + Grain iterator state + run metadata (DESIGN "Runs are
deterministic and resumable").

Saves are asynchronous; Orbax writes each step to a temporary directory and renames it when
complete, so `latest_step` only ever names a finished checkpoint. The data iterator's state is
snapshotted at save time (the live iterator keeps moving while the save is in flight) and
written per process by Grain's own checkpoint handler.
"""

from __future__ import annotations

import json
import os
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp

import nsl
from nsl.errors import NslError


class _Snapshot:
  """A frozen iterator state, so an asynchronous save records the state at the save step."""

  def __init__(self, state):
    # Grain's handler writes non-DatasetIterator states as bytes of text; JSON keeps it readable
    # and is what its restore path parses for the live DatasetIterator.
    self._state = json.dumps(state, indent=1).encode()

  def get_state(self):
    return self._state


class Checkpointer:
  def __init__(self, directory: str, keep: int, async_save: bool = True):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=async_save)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_iterator, metadata: dict[str, Any], force: bool = False) -> bool:
    meta = dict(metadata, step=int(step), process_count=jax.process_count(), nsl_version=nsl.__version__)
    args = {"state": ocp.args.StandardSave(state), "meta": ocp.args.JsonSave(meta)}
    if data_iterator is not None:
      args["data"] = grain.checkpoint.CheckpointSave(_Snapshot(data_iterator.get_state()))
    return self.manager.save(step, args=ocp.args.Composite(**args), force=force)

  def restore(self, step: int, abstract_state, data_iterator=None):
    """Restores the state (resharded onto `abstract_state`'s shardings) and the iterator."""
    meta = self.metadata(step)
    if data_iterator is not None and meta.get("process_count", 1) != jax.process_count():
      raise NslError(f"checkpoint {self.directory}/{step} was written by {meta.get('process_count')} processes "
                     f"but this run has {jax.process_count()}; the data iterator cannot be resharded — "
                     "resume with the same process count, or start a new workdir with --restore_from")
    args = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      args["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    restored = self.manager.restore(step, args=ocp.args.Composite(**args))
    return restored["state"], meta

  def metadata(self, step: int) -> dict[str, Any]:
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def restore_params(path: str, abstract_state):
  """Parameters of the latest checkpoint under `path` (a run's workdir or its checkpoints dir)."""
  directory = path if os.path.basename(os.path.normpath(path)) == "checkpoints" else os.path.join(path, "checkpoints")
  if not os.path.isdir(directory):
    raise NslError(f"--restore_from={path!r}: no checkpoints directory at {directory}")
  manager = ocp.CheckpointManager(os.path.abspath(directory))
  step = manager.latest_step()
  if step is None:
    raise NslError(f"--restore_from={path!r}: no complete checkpoint in {directory}")
  try:
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
  except (ValueError, KeyError) as e:
    raise NslError(f"--restore_from={path!r}: checkpoint step {step} does not match this model "
                   f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from e
  finally:
    manager.close()
  return restored["state"].params, step
