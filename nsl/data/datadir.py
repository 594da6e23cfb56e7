"""The data-directory format: token shards + manifest.json, written atomically, read and verified.

Every writer of a data dir (`nsl.data.prepare`, the tasks in nsl/data/tasks, the LIFT teacher's
`precompute`) goes through this module, and every reader opens one with `load_manifest`:

  manifest.json          format_version FORMAT_VERSION; tokenizer spec, vocab_size, eos_id, dtype,
                         and per split {documents, tokens, shards[, label_shards][, extra_shards]}
  <split>_00000.bin ...  raw little-endian token ids (`token_dtype`); a split is the concatenation
                         of its shards, each listed as {file, tokens, bytes, sha256}

A shard's `file` is relative to the data dir, or absolute (a teacher-states dir points at the
token shards of its source dir instead of copying them).

Writing: `Staging(out_dir)` is a temporary sibling directory `.<name>.tmp-*`; the writer puts
its shards there (`ShardWriter` streams a split, `write_shard` writes one array), then
`install(manifest)` writes the manifest, checks it and every shard it lists against the files
(so a bad writer fails before anything is visible), and renames the directory into place. An
interrupted writer leaves no `out_dir` and a manifest never points at partial data.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from typing import Iterator

import numpy as np

from nsl import storage
from nsl.errors import DataError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
LABEL_IGNORE = 65535  # the stored label of a position with no target (uint16 label shards)
_REQUIRED = ("tokenizer", "vocab_size", "eos_id", "dtype", "splits")
_FIX = "re-run nsl.data.prepare (with --force) to rebuild the directory"


def token_dtype(vocab_size: int) -> np.dtype:
  """uint16 while every id fits (vocab <= 65536), else uint32; always little-endian on disk."""
  return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def sha256_file(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 22), b""):
      h.update(chunk)
  return h.hexdigest()


def write_shard(directory: str, name: str, array: np.ndarray) -> dict:
  """Writes `array` (already in its on-disk dtype) as one shard file; returns its manifest entry."""
  data = np.ascontiguousarray(array).tobytes()
  with open(os.path.join(directory, name), "wb") as f:
    f.write(data)
  return {"file": name, "tokens": int(array.size), "bytes": len(data),
          "sha256": hashlib.sha256(data).hexdigest()}


class ShardWriter:
  """Appends one split's documents to fixed-size shard files `<split>_NNNNN.bin`; hashes each
  shard as it is written and (optionally) counts token frequencies."""

  FLUSH_TOKENS = 1 << 20  # tokens buffered before writing and counting them

  def __init__(self, out_dir: str, split: str, dtype: np.dtype, shard_tokens: int,
               count_vocab: int | None = None):
    self.out_dir, self.split, self.dtype, self.shard_tokens = out_dir, split, dtype, shard_tokens
    self.documents = 0
    self.tokens = 0
    self.shards: list[dict] = []
    self.counts = np.zeros(count_vocab, np.int64) if count_vocab else None
    self._pending: list[np.ndarray] = []
    self._pending_tokens = 0
    self._file = None
    self._hash = None
    self._in_shard = 0

  def add(self, doc: np.ndarray) -> None:
    self.documents += 1
    self._pending.append(doc)
    self._pending_tokens += doc.size
    if self._pending_tokens >= self.FLUSH_TOKENS:
      self._flush()

  def _flush(self) -> None:
    if not self._pending:
      return
    arr = np.concatenate(self._pending)
    self._pending, self._pending_tokens = [], 0
    if self.counts is not None:
      self.counts += np.bincount(arr, minlength=self.counts.size)[: self.counts.size]
    self.tokens += arr.size
    while arr.size:
      if self._file is None:
        name = f"{self.split}_{len(self.shards):05d}.bin"
        self._file = open(os.path.join(self.out_dir, name), "wb")
        self._hash = hashlib.sha256()
        self.shards.append({"file": name, "tokens": 0, "bytes": 0, "sha256": ""})
        self._in_shard = 0
      take = min(arr.size, self.shard_tokens - self._in_shard)
      data = arr[:take].astype(self.dtype, copy=False).tobytes()
      self._file.write(data)
      self._hash.update(data)
      self._in_shard += take
      arr = arr[take:]
      if self._in_shard == self.shard_tokens:
        self._close_shard()

  def _close_shard(self) -> None:
    self._file.close()
    self.shards[-1].update(tokens=self._in_shard, bytes=self._in_shard * self.dtype.itemsize,
                           sha256=self._hash.hexdigest())
    self._file = None

  def close(self) -> dict:
    """Flushes the last shard; returns the split's manifest entry {documents, tokens, shards}."""
    self._flush()
    if self._file is not None:
      self._close_shard()
    return {"documents": self.documents, "tokens": self.tokens, "shards": self.shards}


# -- reading ------------------------------------------------------------------------------------
def _read_json(path: str) -> dict:
  try:
    return json.loads(storage.read_text(path))
  except json.JSONDecodeError as e:
    raise DataError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); delete the "
                    "directory and re-run nsl.data.prepare") from None


def shard_lists(split_entry: dict) -> Iterator[tuple[str, object]]:
  """(name, shard list) of every shard list of one split: tokens, labels, extra arrays."""
  yield "shards", split_entry.get("shards")
  if "label_shards" in split_entry:
    yield "label_shards", split_entry["label_shards"]
  for extra, spec in (split_entry.get("extra_shards") or {}).items():
    yield f"extra_shards.{extra}", (spec or {}).get("shards")


def check_manifest(path: str, manifest) -> None:
  """Every key readers index: a damaged or hand-edited manifest is one DataError, not a KeyError."""
  if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    raise DataError(f"{path} has format_version {version!r}, this nsl reads {FORMAT_VERSION}; "
                    "re-run nsl.data.prepare")
  for key in _REQUIRED:
    if key not in manifest:
      raise DataError(f"{path} lacks {key!r}; re-run nsl.data.prepare")
  try:
    np.dtype(manifest["dtype"])
  except TypeError:
    raise DataError(f"{path}: dtype {manifest['dtype']!r} is not a numpy dtype; {_FIX}") from None
  for key in ("vocab_size", "eos_id"):
    if not isinstance(manifest[key], int) or isinstance(manifest[key], bool):
      raise DataError(f"{path}: {key}={manifest[key]!r} must be an integer; {_FIX}")
  splits = manifest["splits"]
  if not isinstance(splits, dict) or "train" not in splits:
    raise DataError(f"{path}: 'splits' must map split names (train, val) to their shards; {_FIX}")
  for name, split in splits.items():
    if not isinstance(split, dict):
      raise DataError(f"{path}: split {name!r} is not an object; {_FIX}")
    for key in ("tokens", "shards"):
      if key not in split:
        raise DataError(f"{path}: split {name!r} lacks {key!r}; {_FIX}")
    if "label_shards" in split and "label_ignore" not in manifest:
      raise DataError(f"{path}: split {name!r} has label_shards but the manifest lacks 'label_ignore'; {_FIX}")
    for list_name, shards in shard_lists(split):
      if not isinstance(shards, list):
        raise DataError(f"{path}: split {name!r} {list_name} must be a list of shards; {_FIX}")
      for i, shard in enumerate(shards):
        missing = [k for k in ("file", "tokens", "bytes") if not isinstance(shard, dict) or k not in shard]
        if missing:
          raise DataError(f"{path}: split {name!r} {list_name}[{i}] lacks {', '.join(map(repr, missing))}; {_FIX}")


def load_manifest(data_dir: str) -> dict:
  """The manifest of a prepared data directory (DataError if missing, invalid or too new)."""
  path = storage.join(data_dir, MANIFEST)
  if not storage.isfile(path):
    what = "does not exist" if not storage.isdir(data_dir) else f"has no {MANIFEST}"
    hint = (f"run `python -m nsl.data.prepare --source=... --out={data_dir}` first, or copy a prepared dir there "
            "(docs/guide/data.md#data-in-object-storage)"
            if storage.is_remote(data_dir) else f"run `python -m nsl.data.prepare --source=... --out={data_dir}` first")
    raise DataError(f"data dir {data_dir} {what}; {hint}")
  manifest = _read_json(path)
  check_manifest(path, manifest)
  return manifest


def _verify_list(data_dir: str, shards: list, full_checksum: bool) -> None:
  for shard in shards:
    path = os.path.join(data_dir, shard["file"])
    size = os.path.getsize(path) if os.path.isfile(path) else None
    if size is None:
      raise DataError(f"corrupt shard {path}: file missing; re-run nsl.data.prepare")
    if size != shard["bytes"]:
      raise DataError(f"corrupt shard {path}: expected {shard['bytes']} bytes, found {size}; "
                      "re-run nsl.data.prepare")
    if full_checksum:
      digest = sha256_file(path)
      if digest != shard.get("sha256"):
        raise DataError(f"corrupt shard {path}: sha256 {digest[:12]}... differs from the "
                        f"manifest's {str(shard.get('sha256'))[:12]}...; re-run nsl.data.prepare")


def _split_entry(data_dir: str, manifest: dict, split: str) -> dict:
  if split not in manifest["splits"]:
    raise DataError(f"{os.path.join(data_dir, MANIFEST)} has no split {split!r} "
                    f"(has {sorted(manifest['splits'])})")
  return manifest["splits"][split]


def verify_shards(data_dir: str, manifest: dict, split: str, full_checksum: bool = False) -> None:
  """Checks a split's token shards exist with the recorded sizes (and sha256 when `full_checksum`)."""
  _verify_list(data_dir, _split_entry(data_dir, manifest, split)["shards"], full_checksum)


def verify_split(data_dir: str, manifest: dict, split: str, full_checksum: bool = False) -> None:
  """`verify_shards` for every shard list of the split: tokens, label_shards, extra_shards."""
  for _, shards in shard_lists(_split_entry(data_dir, manifest, split)):
    _verify_list(data_dir, shards, full_checksum)


def tokenizer_fingerprint(data_dir: str, manifest: dict) -> str:
  """The tokenizer identity of a data dir: its spec plus the sha256 of its file (BPE, GPT-2), so
  two BPEs trained on different text differ. Data dirs compare equal iff their ids mean the same."""
  name = tokenizer_file(manifest)
  path = storage.join(data_dir, name) if name else ""
  if name and storage.is_remote(data_dir):  # read in place: the dir need not be fetched whole
    digest = hashlib.sha256(storage.Path(path).read_bytes()).hexdigest() if storage.isfile(path) else ""
  else:
    digest = sha256_file(path) if name and os.path.isfile(path) else ""
  return json.dumps(manifest["tokenizer"], sort_keys=True) + digest


def tokenizer_file(manifest: dict) -> str | None:
  """The file a data dir's tokenizer lives in (BPE `tokenizer.json`, GPT-2 ranks), if any."""
  spec = manifest["tokenizer"]
  default = {"bpe": "tokenizer.json", "gpt2": "gpt2.tiktoken"}.get(spec.get("name"))
  return spec.get("file", default) if default else None


# -- writing ------------------------------------------------------------------------------------
def copy_tokenizer(src_dir: str, manifest: dict, dst_dir: str) -> None:
  """Copies `src_dir`'s tokenizer file (manifest `manifest`) into `dst_dir` byte for byte, so the
  new dir has the same `tokenizer_fingerprint` (a re-serialised BPE could hash differently)."""
  name = tokenizer_file(manifest)
  if name:
    src = os.path.join(src_dir, name)
    if not os.path.isfile(src):
      raise DataError(f"tokenizer file {src} is missing; re-run nsl.data.prepare for {src_dir}")
    shutil.copyfile(src, os.path.join(dst_dir, name))


def install(tmp_dir: str, out_dir: str, force: bool) -> None:
  """Moves the finished tmp dir to out_dir (atomic rename; replaces an old one with force)."""
  if os.path.isdir(out_dir) and not os.listdir(out_dir):
    os.rmdir(out_dir)  # an empty dir (e.g. made by the user) is not data to protect
  if os.path.exists(out_dir):
    if not force:
      raise DataError(f"{out_dir} already exists; remove it or pass --force")
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-",
                           dir=os.path.dirname(out_dir))
    os.rename(out_dir, os.path.join(old, "d"))
    os.rename(tmp_dir, out_dir)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.rename(tmp_dir, out_dir)


class Staging:
  """`with Staging(out_dir) as st:` write files under `st.path`, then `st.install(manifest)`.

  `st.path` is a fresh sibling of `out_dir` readable as the umask allows (mkdtemp's 0700 would
  hide the data from other users); it is removed on leaving the block unless installed."""

  def __init__(self, out_dir: str):
    self.out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(self.out_dir)
    os.makedirs(parent, exist_ok=True)
    self.path = tempfile.mkdtemp(prefix=f".{os.path.basename(self.out_dir)}.tmp-", dir=parent)
    umask = os.umask(0o022)
    os.umask(umask)
    os.chmod(self.path, 0o777 & ~umask)

  def __enter__(self) -> "Staging":
    return self

  def __exit__(self, *exc) -> None:
    shutil.rmtree(self.path, ignore_errors=True)

  def write_manifest(self, manifest: dict) -> None:
    """Writes and checks the manifest and the shards it lists (sizes) inside the staging dir."""
    path = os.path.join(self.path, MANIFEST)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=1)
      f.flush()
      os.fsync(f.fileno())
    check_manifest(path, manifest)
    for split in manifest["splits"]:
      verify_split(self.path, manifest, split)

  def install(self, manifest: dict, force: bool = False) -> dict:
    """`write_manifest`, then the atomic rename onto out_dir (`install`); returns the manifest."""
    self.write_manifest(manifest)
    install(self.path, self.out_dir, force)
    return manifest


def write_labelled_dir(out_dir: str, splits: dict[str, tuple[np.ndarray, np.ndarray]], *, tokenizer: str,
                       vocab_size: int, eos_id: int, seed: int, val_fraction: float, extra: dict,
                       extra_files: dict[str, dict[str, np.ndarray]] | None = None, force: bool = False) -> dict:
  """A labelled task dir (S5, arithmetic): per split, windows of uint16 tokens and labels
  [n, window] as `<split>_00000.bin` / `<split>_labels_00000.bin` (`label_shards`, stored
  LABEL_IGNORE = no target), `extra_files` as compressed npz beside them, the task's parameters
  under manifest["task"] (`extra`). Atomic like every writer here."""
  out_dir = os.path.abspath(out_dir)
  if os.path.isfile(os.path.join(out_dir, MANIFEST)) and not force:
    raise DataError(f"{out_dir} is already prepared; pass --force to rebuild it")
  with Staging(out_dir) as st:
    manifest_splits = {}
    for split, (tok, lab) in splits.items():
      manifest_splits[split] = {
          "documents": int(tok.shape[0]), "tokens": int(tok.size),
          "shards": [write_shard(st.path, f"{split}_00000.bin", tok)],
          "label_shards": [write_shard(st.path, f"{split}_labels_00000.bin", lab)],
      }
    for name, arrays in (extra_files or {}).items():
      np.savez_compressed(os.path.join(st.path, name), **arrays)
    manifest = {
        "format_version": FORMAT_VERSION, "sources": [tokenizer], "max_docs": None, "seed": seed,
        "val_fraction": val_fraction, "tokenizer": {"name": tokenizer}, "vocab_size": vocab_size,
        "eos_id": eos_id, "dtype": "uint16", "shard_tokens": None, "unigram_entropy_nats": None,
        "label_ignore": LABEL_IGNORE, "splits": manifest_splits, "task": extra,
    }
    return st.install(manifest, force)


# -- object storage -----------------------------------------------------------------------------
def fetch(data_dir: str) -> str:
  """The local directory to read `data_dir` from: itself when local; for `gs://...` a copy in
  `$NSL_CACHE_DIR/data/` (docs/guide/data.md#data-in-object-storage), brought up to date with the
  bucket's manifest. Each shard is downloaded once, checked against the manifest's size and
  sha256, and the manifest is written last, so an interrupted copy is resumed, never read."""
  if not storage.is_remote(data_dir):
    return data_dir
  data_dir = storage.resolve(data_dir)
  storage.check_bucket(data_dir, "config.data.path")
  manifest = load_manifest(data_dir)  # DataError naming the bucket path when it is missing
  remote_text = json.dumps(manifest, sort_keys=True)
  local = storage.cache_dir("data", data_dir)
  local_manifest = os.path.join(local, MANIFEST)
  if os.path.isfile(local_manifest):
    try:
      if json.dumps(_read_json(local_manifest), sort_keys=True) == remote_text:
        return local
    except DataError:
      pass
    os.remove(local_manifest)  # the bucket's copy changed: the old one must not be read
  os.makedirs(local, exist_ok=True)
  expected = {}
  for split in manifest["splits"].values():
    for _, shards in shard_lists(split):
      for shard in shards:
        if not os.path.isabs(shard["file"]):
          expected[shard["file"]] = shard
  names = set(expected) | {n for n in storage.listdir(data_dir) if n != MANIFEST and not n.startswith(".")}
  for name in sorted(names):
    src, dst = storage.join(data_dir, name), os.path.join(local, name)
    shard = expected.get(name)
    if shard is not None and os.path.isfile(dst) and os.path.getsize(dst) == shard["bytes"]:
      continue  # kept from an interrupted copy; verified below
    if not storage.isfile(src):
      if shard is not None:
        raise DataError(f"corrupt data dir {data_dir}: its manifest lists {name}, which is not there; {_FIX}")
      continue  # a sub-directory: data dirs are flat
    storage.download(src, dst)
  for split in manifest["splits"]:
    verify_split(local, manifest, split, full_checksum=True)
  tmp = f"{local_manifest}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1)
  os.replace(tmp, local_manifest)
  return local
