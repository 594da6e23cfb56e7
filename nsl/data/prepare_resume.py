"""A resumable prepare: a fixed staging directory, shard writers that can be snapshotted, a journal.

`nsl.data.prepare` writes into `.<out>.partial/` beside `--out` (not a random temporary name), so a
prepare killed by SIGKILL, a pre-emption or Ctrl-C leaves its work where the next run with the
same settings finds it. After every document batch that closed a shard, both splits' writers are
flushed to disk and fsync'ed and `progress.npz` is replaced atomically (write, fsync, rename): it
holds the number of documents consumed, each writer's shards (with sha256), the bytes of its
open shard and the train token counts. A rerun truncates each open shard to its recorded length,
re-hashes it, deletes shard files written after the journal, skips the consumed documents and
carries on, so the finished directory is byte-identical to an uninterrupted run's
(docs/guide/data.md#prepare-resume).

An flock on `.<out>.partial.lock` keeps two prepares of the same `--out` (two grid cells sharing
a data dir) out of one partial directory: the second one stages privately, as prepare always did.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from nsl.data import datadir

JOURNAL = "progress.npz"
JOURNAL_VERSION = 1


class ResumableShardWriter(datadir.ShardWriter):
  """A ShardWriter whose state at a document boundary can be saved and restored (`snapshot`,
  `restore`); the bytes it writes are the base writer's, whatever the snapshot points."""

  def snapshot(self) -> dict:
    """Writes every buffered token and fsyncs the open shard; returns the state as JSON."""
    self._flush()
    open_tokens = None
    if self._file is not None:
      self._file.flush()
      os.fsync(self._file.fileno())
      open_tokens = self._in_shard
    return {"documents": self.documents, "tokens": self.tokens,
            "shards": [dict(s) for s in self.shards], "open_tokens": open_tokens}

  def restore(self, state: dict, counts: np.ndarray | None) -> None:
    """Returns the files and this writer to `state` (from `snapshot`, on a fresh writer)."""
    self.documents, self.tokens = int(state["documents"]), int(state["tokens"])
    self.shards = [dict(s) for s in state["shards"]]
    if counts is not None and self.counts is not None:
      self.counts[:] = counts
    kept = {s["file"] for s in self.shards}
    for name in os.listdir(self.out_dir):  # shards begun after the journal was written
      if name.startswith(f"{self.split}_") and name.endswith(".bin") and name not in kept:
        os.remove(os.path.join(self.out_dir, name))
    if state["open_tokens"] is None:
      return
    path = os.path.join(self.out_dir, self.shards[-1]["file"])
    size = int(state["open_tokens"]) * self.dtype.itemsize
    self._file = open(path, "r+b")
    self._file.truncate(size)
    self._hash = hashlib.sha256()
    for chunk in iter(lambda: self._file.read(1 << 22), b""):
      self._hash.update(chunk)
    self._file.seek(size)
    self._in_shard = int(state["open_tokens"])

  def full_shards(self) -> int:
    """How many shards the documents added so far fill (buffered tokens included)."""
    return (self.tokens + self._pending_tokens) // self.shard_tokens

  def open_shard(self) -> tuple[str, int] | None:
    """(file, tokens written) of the shard being filled, else None (call after `snapshot`)."""
    return (self.shards[-1]["file"], self._in_shard) if self._file is not None else None


class PartialDir:
  """The staging directory of one `--out`: `.<name>.partial` when its lock is free (resumable),
  else a private temporary sibling (`resumable` False). Use as a context manager; `install`
  renames it into place. On an exception other than an interrupt it is removed, as before; an
  interrupt (KeyboardInterrupt) or a kill leaves it for the next run."""

  def __init__(self, out_dir: str, settings: dict):
    self.out_dir = os.path.abspath(out_dir)
    self.settings = json.loads(json.dumps(settings))
    parent, base = os.path.dirname(self.out_dir), os.path.basename(self.out_dir)
    os.makedirs(parent, exist_ok=True)
    self._lock = open(os.path.join(parent, f".{base}.partial.lock"), "a+")
    try:
      fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
      self.resumable = True
      self.path = os.path.join(parent, f".{base}.partial")
      os.makedirs(self.path, exist_ok=True)
    except BlockingIOError:
      self._lock.close()
      self._lock = None
      self.resumable = False
      self.path = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=parent)
    umask = os.umask(0o022)
    os.umask(umask)
    os.chmod(self.path, 0o777 & ~umask)  # mkdtemp's 0700 would hide the data from other users
    self.installed = False

  def __enter__(self) -> "PartialDir":
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if not self.installed and not (self.resumable and exc_type is KeyboardInterrupt):
      shutil.rmtree(self.path, ignore_errors=True)
    self._release()

  def _release(self) -> None:
    if self._lock is not None:
      if not os.path.isdir(self.path):  # installed or removed: nothing left to resume
        try:
          os.remove(self._lock.name)
        except OSError:
          pass
      fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
      self._lock.close()
      self._lock = None

  # -- the journal ------------------------------------------------------------------------------
  def due(self, since_journal: int, shard_tokens: int, train: ResumableShardWriter,
          val: ResumableShardWriter) -> bool:
    """Whether to journal at this document boundary: after about every shard's worth of tokens."""
    del train, val  # a bucket's staging (nsl.data.prepare_remote) journals when a shard fills
    return since_journal >= shard_tokens

  def load(self) -> dict | None:
    """The journal of an earlier run with the same settings, else None (and a clean directory)."""
    if not self.resumable:
      return None
    path = os.path.join(self.path, JOURNAL)
    state = None
    if os.path.isfile(path):
      try:
        with np.load(path) as z:
          state = json.loads(bytes(z["state"]).decode("utf-8"))
          state["train_counts"] = np.array(z["train_counts"]) if "train_counts" in z else None
      except (OSError, ValueError, KeyError):
        state = None
    if state is not None and state.get("version") == JOURNAL_VERSION and state.get("settings") == self.settings:
      return state
    if os.listdir(self.path):
      why = "of other settings" if state is not None else "without a journal (killed before its first shard)"
      print(f"prepare: starting over; discarding an unfinished prepare {why} in {self.path}",
            file=sys.stderr, flush=True)
      shutil.rmtree(self.path)
      os.makedirs(self.path)
    return None

  def save(self, next_doc: int, tokenizer_spec: dict, train: ResumableShardWriter,
           val: ResumableShardWriter) -> None:
    """Flushes both writers and atomically replaces the journal (a document boundary)."""
    if not self.resumable:
      return
    state = {"version": JOURNAL_VERSION, "settings": self.settings, "next_doc": int(next_doc),
             "tokenizer": tokenizer_spec, "train": train.snapshot(), "val": val.snapshot()}
    buf = io.BytesIO()
    arrays = {"state": np.frombuffer(json.dumps(state).encode("utf-8"), np.uint8)}
    if train.counts is not None:
      arrays["train_counts"] = train.counts
    np.savez(buf, **arrays)
    tmp = os.path.join(self.path, JOURNAL + ".tmp")
    with open(tmp, "wb") as f:
      f.write(buf.getvalue())
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, os.path.join(self.path, JOURNAL))

  def install(self, manifest: dict, force: bool = False) -> dict:
    """Drops the journal, writes and checks the manifest and its shards, renames into place."""
    for name in (JOURNAL, JOURNAL + ".tmp"):
      if os.path.exists(os.path.join(self.path, name)):
        os.remove(os.path.join(self.path, name))
    datadir.Staging.write_manifest(self, manifest)  # it needs only `.path`
    datadir.install(self.path, self.out_dir, force)
    self.installed = True
    return manifest
