"""`python -m nsl.data.prepare --out=gs://bucket/dir`: a data dir prepared into a bucket
(docs/guide/data.md#prepare-to-a-bucket).

The shards are written as for a local `--out`, by the same writer, into a resumable staging dir
under `$NSL_CACHE_DIR/prepare/` (`prepare_resume.PartialDir`), so the bucket ends up with the
bytes a local prepare writes. Each time the journal is written, the bucket is brought up to it:

  - every complete shard not yet there is uploaded (once: a complete shard never changes);
  - the bytes of each open shard written since the last upload go up as a chunk object
    `.nsl-prepare/<file>@<start>-<end>` (byte offsets);
  - the tokenizer file (once), and the journal `.nsl-prepare/progress.npz` last, so the journal in
    the bucket names only objects that are there.

For a bucket the journal is taken after the first batch of documents that fills a shard (`due`):
open shards then hold at most about a batch, and few bytes go up twice. An error other than an
interrupt removes the staging dir, as for a local prepare; the bucket keeps its journal. At the end the last shards go up, every
shard the manifest lists is checked in the bucket (its size), the manifest is uploaded last (a
reader sees no data dir until it is complete), and `.nsl-prepare/` and the staging dir are removed.

A rerun resumes from this host's staging dir when it has one, else from the bucket's journal:
the tokenizer file and the open shards' chunks come down (complete shards stay in the bucket), so
a prepare moved to another host continues where the bucket says. A bucket journal of other
settings, or one whose objects are not all there, is discarded with a line, as a local one is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import numpy as np

from nsl import storage
from nsl.data import datadir
from nsl.data import tokenizers as tok_lib
from nsl.data.prepare_resume import JOURNAL, JOURNAL_VERSION, PartialDir, ResumableShardWriter
from nsl.errors import DataError

STATE = ".nsl-prepare"  # the unfinished prepare's journal and chunks, beside its shards
_CHUNK = re.compile(r"^(?P<file>.+)@(?P<start>\d+)-(?P<end>\d+)$")


def _fs(url: str):
  import fsspec

  fs = fsspec.filesystem(storage.scheme(url))
  fs.invalidate_cache()  # another process (a killed prepare's host) may have written since
  return fs


def objects(url: str) -> dict[str, int]:
  """{name relative to `url`: size} of every object under it, `.nsl-prepare/` included."""
  prefix = url.split("://", 1)[1].rstrip("/") + "/"
  try:
    found = _fs(url).find(url, detail=True)
  except FileNotFoundError:
    return {}
  return {name[len(prefix):]: int(info.get("size") or 0) for name, info in found.items()
          if name.startswith(prefix)}


def check_out(url: str, force: bool) -> None:
  """Refuses, in one line and before anything is written, an unreachable or missing bucket, a
  prepared dir without --force, and a prefix holding objects prepare did not write."""
  storage.check_bucket(url, "--out")
  names = objects(url)
  if datadir.MANIFEST in names:
    if not force:
      raise DataError(f"{url} is already prepared; pass --force to rebuild it")
  elif names and f"{STATE}/{JOURNAL}" not in names:
    shown = ", ".join(sorted(names)[:3]) + (", ..." if len(names) > 3 else "")
    raise DataError(f"--out={url} holds objects nsl.data.prepare did not write ({shown}); choose another --out")


def _cover(names: dict[str, int], file: str) -> list[tuple[int, int]]:
  """The chunks of `file` that join up from byte 0, in order (the longest at each start)."""
  ends: dict[int, int] = {}
  for name in names:
    m = _CHUNK.match(name[len(STATE) + 1:]) if name.startswith(STATE + "/") else None
    if m and m["file"] == file:
      start, end = int(m["start"]), int(m["end"])
      ends[start] = max(end, ends.get(start, end))
  out, pos = [], 0
  while pos in ends and ends[pos] > pos:
    out.append((pos, ends[pos]))
    pos = ends[pos]
  return out


class RemoteDir(PartialDir):
  """The staging of a bucket `--out`: a local `PartialDir` whose journal is mirrored into the bucket
  (module docstring); `install` uploads instead of renaming."""

  def __init__(self, url: str, settings: dict, force: bool = False):
    self.url = storage.resolve(url)
    super().__init__(storage.cache_dir("prepare", self.url), settings)
    self._known = objects(self.url)
    self._filled = (0, 0)
    if force and datadir.MANIFEST in self._known:
      print(f"prepare: --force: deleting the prepared {self.url} first", file=sys.stderr, flush=True)
      self._discard()

  def _discard(self) -> None:
    """Deletes every object under the URL, the journal last (a kill midway leaves it claimed)."""
    fs, journal = _fs(self.url), f"{STATE}/{JOURNAL}"
    rest = [storage.join(self.url, n) for n in self._known if n != journal]
    if rest:
      fs.rm(rest)
    if journal in self._known:
      fs.rm(storage.join(self.url, journal))
    self._known = {}

  # -- resume -----------------------------------------------------------------------------------
  def load(self) -> dict | None:
    state = super().load()
    if not self.resumable:
      return state
    journal = f"{STATE}/{JOURNAL}"
    if journal in self._known and state is None:
      why = self._hydrate()
      if not why:
        return super().load()
      print(f"prepare: starting over; discarding an unfinished prepare in {self.url} ({why})",
            file=sys.stderr, flush=True)
      shutil.rmtree(self.path)
      os.makedirs(self.path)
      self._discard()
    elif journal in self._known and self._bucket_settings() != self.settings:
      print(f"prepare: discarding an unfinished prepare of other settings in {self.url}", file=sys.stderr, flush=True)
      self._discard()
    return state

  def _bucket_settings(self) -> dict | None:
    local = os.path.join(self.path, JOURNAL + ".bucket")
    try:
      storage.download(storage.join(self.url, STATE, JOURNAL), local)
      with np.load(local) as z:
        return json.loads(bytes(z["state"]).decode("utf-8")).get("settings")
    except (OSError, ValueError, KeyError):
      return None
    finally:
      if os.path.exists(local):
        os.remove(local)

  def _hydrate(self) -> str:
    """Brings the bucket's journal, tokenizer and open shards into the empty staging dir; '' when
    done, else why it cannot resume from them."""
    path = os.path.join(self.path, JOURNAL)
    try:
      storage.download(storage.join(self.url, STATE, JOURNAL), path)
      with np.load(path) as z:
        state = json.loads(bytes(z["state"]).decode("utf-8"))
    except (OSError, ValueError, KeyError):
      return "its journal cannot be read"
    if state.get("version") != JOURNAL_VERSION or state.get("settings") != self.settings:
      return "of other settings"
    tokenizer = datadir.tokenizer_file({"tokenizer": state["tokenizer"]})
    if tokenizer:
      if tokenizer not in self._known:
        return f"its tokenizer file {tokenizer} is missing"
      storage.download(storage.join(self.url, tokenizer), os.path.join(self.path, tokenizer))
    itemsize = datadir.token_dtype(tok_lib.load_tokenizer(state["tokenizer"], self.path).vocab_size).itemsize
    for split in ("train", "val"):
      shards, open_tokens = state[split]["shards"], state[split]["open_tokens"]
      complete = shards[:-1] if open_tokens is not None else shards
      lost = [s["file"] for s in complete if self._known.get(s["file"]) != s["bytes"]]
      if lost:
        return f"its shard {lost[0]} is missing"
      if open_tokens is None:
        continue
      file = shards[-1]["file"]
      need = int(open_tokens) * itemsize
      chunks = _cover(self._known, file)
      if (chunks[-1][1] if chunks else 0) < need:
        return f"the start of its open shard {file} is missing"
      with open(os.path.join(self.path, file), "wb") as f:
        for start, end in chunks:
          f.write(_fs(self.url).cat_file(storage.join(self.url, STATE, f"{file}@{start}-{end}")))
    print(f"prepare: this host has no staging dir; resuming from the journal in {self.url}/{STATE}",
          file=sys.stderr, flush=True)
    return ""

  # -- the journal, mirrored --------------------------------------------------------------------
  def due(self, since_journal: int, shard_tokens: int, train: ResumableShardWriter,
          val: ResumableShardWriter) -> bool:
    """After the batch of documents that fills a shard (open shards then hold at most a batch)."""
    del since_journal, shard_tokens
    filled = (train.full_shards(), val.full_shards())
    if filled == self._filled:
      return False
    self._filled = filled
    return True

  def save(self, next_doc: int, tokenizer_spec: dict, train: ResumableShardWriter,
           val: ResumableShardWriter) -> None:
    super().save(next_doc, tokenizer_spec, train, val)  # flushes the writers, writes the journal
    if not self.resumable:
      return  # a private staging (another prepare holds the lock) uploads only at install
    self._filled = (train.full_shards(), val.full_shards())
    journal = f"{STATE}/{JOURNAL}"
    first = journal not in self._known
    if first:  # the claim, before any shard: the prefix is an unfinished prepare's from here on
      self._upload(JOURNAL, journal)
    opened = [w.open_shard() for w in (train, val)]
    for w, open_shard in zip((train, val), opened):
      self._upload_complete([s for s in w.shards if open_shard is None or s["file"] != open_shard[0]])
      if open_shard is not None:
        self._upload_chunk(open_shard[0], open_shard[1] * w.dtype.itemsize)
    name = datadir.tokenizer_file({"tokenizer": tokenizer_spec})
    if name and name not in self._known:
      self._upload(name, name)
    self._upload(JOURNAL, journal)  # last: it names only objects that are in the bucket now
    # Chunks of shards that are complete now are garbage once the journal above is in place.
    still_open = {o[0] for o in opened if o is not None}
    stale = [n for n in self._known if (m := _CHUNK.match(n[len(STATE) + 1:])) and n.startswith(STATE + "/")
             and m["file"] not in still_open and any(m["file"] == s["file"] for w in (train, val) for s in w.shards)]
    if stale:
      _fs(self.url).rm([storage.join(self.url, n) for n in stale])
      for n in stale:
        del self._known[n]

  def _upload(self, local_name: str, name: str) -> None:
    src = os.path.join(self.path, local_name)
    storage.upload(src, storage.join(self.url, name))
    self._known[name] = os.path.getsize(src)

  def _upload_complete(self, shards: list[dict]) -> None:
    for s in shards:
      if self._known.get(s["file"]) != s["bytes"]:
        self._upload(s["file"], s["file"])

  def _upload_chunk(self, file: str, end: int) -> None:
    chunks = _cover(self._known, file)
    start = chunks[-1][1] if chunks else 0
    if end <= start:
      return
    with open(os.path.join(self.path, file), "rb") as f:
      f.seek(start)
      data = f.read(end - start)
    name = f"{STATE}/{file}@{start}-{end}"
    _fs(self.url).pipe_file(storage.join(self.url, name), data)
    self._known[name] = len(data)

  # -- the end ----------------------------------------------------------------------------------
  def install(self, manifest: dict, force: bool = False) -> dict:
    """Uploads the last shards, checks every listed shard in the bucket, uploads the manifest."""
    del force  # an old prepared dir was deleted when this staging began
    for name in (JOURNAL, JOURNAL + ".tmp"):
      if os.path.exists(os.path.join(self.path, name)):
        os.remove(os.path.join(self.path, name))
    path = os.path.join(self.path, datadir.MANIFEST)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=1)  # the bytes a local prepare writes
    datadir.check_manifest(path, manifest)
    shards = [s for split in manifest["splits"].values() for _, lst in datadir.shard_lists(split) for s in lst]
    self._upload_complete(shards)
    name = datadir.tokenizer_file(manifest)
    if name and name not in self._known:
      self._upload(name, name)
    found = objects(self.url)
    for s in shards:
      if found.get(s["file"]) != s["bytes"]:
        raise DataError(f"{storage.join(self.url, s['file'])}: {found.get(s['file'])} bytes in the bucket after "
                        f"its upload, the manifest says {s['bytes']}; rerun the same command")
    storage.upload(path, storage.join(self.url, datadir.MANIFEST))
    storage.rmtree(storage.join(self.url, STATE))
    shutil.rmtree(self.path, ignore_errors=True)
    self.installed = True
    return manifest

