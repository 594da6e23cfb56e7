"""Grain pipelines over prepared token shards: packed, host-sharded, checkpointable batches.

A split is the logical concatenation of its shards (memory-mapped, never loaded into RAM), cut
into non-overlapping windows of `seq_len + 1` tokens; window w holds tokens
[w (seq_len+1), (w+1)(seq_len+1)) and may straddle a shard boundary. The tail shorter than a
window is not used. Documents are packed: a window usually holds the end of one document, some
whole ones and the start of another, told apart by `segment`:

  segment[i] = 1 + (number of EOS in tokens[:i])

so segment ids start at 1 in every window and an EOS belongs to the document it ends. Padding
rows (evaluation only) have token EOS and segment 0, which attention masks treat as padding.

Training order: window indices are shuffled by Grain's index shuffle with `seed` (epoch e uses
seed + e, so every epoch is a new deterministic permutation), repeated forever, and cut into
global batches of `global_batch_size` consecutive shuffled indices (a batch may straddle two
epochs). Process p reads only rows [p B, (p+1) B) of each global batch, B = global / processes,
so the processes together see exactly the single-process batches. Batching happens on indices
before any token is read, so a process never touches other processes' rows.

Labelled task data (nsl/data/tasks): when a split in the manifest also lists `label_shards`
(same layout and length as its token shards), every batch also carries `labels`, int32 aligned
with `tokens`, where the stored value `manifest["label_ignore"]` becomes -1 (no target). A split's
`extra_shards` ({name: {width, dtype, shards}}, e.g. precomputed LIFT teacher states) add
`name` [B, seq_len + 1, width] (int32 or float32; zeros in padding rows). Plain corpora have
neither and yield exactly {'tokens', 'segment'} as before.

The iterator is a Grain DatasetIterator: `get_state()` / `set_state()` checkpoint and restore
its position exactly. Reading and packing (the memmap copies, segment ids, labels) run on
`READ_THREADS` Grain worker threads that keep up to `PREFETCH` batches ready ahead of the train
step; Grain hands them out in index order, so the batches, and the state (`{"next_index": i}`,
the same as with no threads, so older checkpoints restore), do not depend on the thread count
(docs/guide/data.md#pipeline).
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from nsl.data.datadir import load_manifest, verify_split
from nsl.errors import ConfigError, DataError

VERIFY_MODES = ("size", "sha256")
READ_THREADS = 2  # a batch is a few memmap copies: two threads keep far ahead of any train step
PREFETCH = 4  # batches read ahead (host memory: PREFETCH x rows x (seq_len + 1) x 8 bytes)


class SplitTokens:
  """A split's shards as one read-only logical token array."""

  def __init__(self, data_dir: str, manifest: dict, split: str, key: str = "shards"):
    shards = manifest["splits"][split][key]
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")  # shards are little-endian on disk
    self.maps = [np.memmap(os.path.join(data_dir, s["file"]), dtype=dtype, mode="r",
                           shape=(s["tokens"],)) for s in shards]
    self.starts = np.cumsum([0] + [s["tokens"] for s in shards], dtype=np.int64)
    self.out_dtype = np.int32 if dtype.kind in "ui" else np.float32
    self.num_tokens = int(self.starts[-1])

  def read(self, start: int, length: int) -> np.ndarray:
    """Tokens [start, start + length) as int32, crossing shard boundaries as needed."""
    out = np.empty(length, self.out_dtype)
    shard = int(np.searchsorted(self.starts, start, side="right")) - 1
    done = 0
    while done < length:
      offset = start + done - int(self.starts[shard])
      take = min(length - done, self.maps[shard].shape[0] - offset)
      out[done:done + take] = self.maps[shard][offset:offset + take]
      done += take
      shard += 1
    return out


def segment_ids(tokens: np.ndarray, eos_id: int) -> np.ndarray:
  """segment[..., i] = 1 + number of EOS in tokens[..., :i] (int32, same shape)."""
  seg = np.ones(tokens.shape, np.int32)
  np.cumsum(tokens[..., :-1] == eos_id, axis=-1, dtype=np.int32, out=seg[..., 1:])
  seg[..., 1:] += 1
  return seg


def open_labels(data_dir: str, manifest: dict, split: str):
  """(SplitTokens over the split's label shards, stored ignore value), or None for plain corpora."""
  if "label_shards" not in manifest["splits"][split]:
    return None
  return SplitTokens(data_dir, manifest, split, key="label_shards"), int(manifest["label_ignore"])


def open_extras(data_dir: str, manifest: dict, split: str) -> dict:
  """{name: (reader over the flattened [tokens * width] values, width)} of a split's `extra_shards`."""
  out = {}
  for name, spec in manifest["splits"][split].get("extra_shards", {}).items():
    width = int(spec["width"])
    flat = {"dtype": spec["dtype"], "splits": {split: {"shards": [dict(s, tokens=s["tokens"] * width)
                                                                  for s in spec["shards"]]}}}
    out[name] = (SplitTokens(data_dir, flat, split), width)
  return out


def _read_extra(reader, width: int, start: int, length: int) -> np.ndarray:
  return reader.read(start * width, length * width).reshape(length, width)


def _as_labels(raw: np.ndarray, ignore: int) -> np.ndarray:
  return np.where(raw == ignore, -1, raw).astype(np.int32)


class _ReadRows:
  """Global batch of window indices -> this process's rows of tokens and segments (and labels)."""

  def __init__(self, tokens: SplitTokens, window: int, eos_id: int, rows: slice, labels=None, extras=None):
    self.tokens, self.window, self.eos_id, self.rows = tokens, window, eos_id, rows
    self.labels, self.extras = labels, extras or {}

  def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    mine = np.asarray(indices)[self.rows]
    toks = np.stack([self.tokens.read(int(w) * self.window, self.window) for w in mine])
    out = {"tokens": toks, "segment": segment_ids(toks, self.eos_id)}
    if self.labels is not None:
      lab, ignore = self.labels
      out["labels"] = _as_labels(np.stack([lab.read(int(w) * self.window, self.window) for w in mine]), ignore)
    for name, (reader, width) in self.extras.items():
      out[name] = np.stack([_read_extra(reader, width, int(w) * self.window, self.window) for w in mine])
    return out


def _open_split(data_dir: str, split: str, seq_len: int, verify: str):
  if verify not in VERIFY_MODES:
    raise ConfigError(f"verify={verify!r} must be one of {VERIFY_MODES}")
  if seq_len <= 0:
    raise ConfigError(f"seq_len={seq_len} must be positive")
  manifest = load_manifest(data_dir)
  verify_split(data_dir, manifest, split, full_checksum=verify == "sha256")  # tokens, labels, extra arrays
  tokens = SplitTokens(data_dir, manifest, split)
  return manifest, tokens, tokens.num_tokens // (seq_len + 1)


def _local_rows(batch_size: int, process_index: int, process_count: int, field: str) -> slice:
  if process_count <= 0 or not 0 <= process_index < process_count:
    raise ConfigError(f"process_index={process_index} must be in "
                      f"[0, process_count={process_count})")
  if batch_size <= 0 or batch_size % process_count:
    raise ConfigError(f"{field}={batch_size} must be a positive multiple of the process count "
                      f"{process_count}")
  local = batch_size // process_count
  return slice(process_index * local, (process_index + 1) * local)


def num_windows(data_dir: str, split: str, seq_len: int) -> int:
  """How many packed windows of seq_len + 1 tokens a split holds (one epoch)."""
  manifest = load_manifest(data_dir)
  if split not in manifest["splits"]:
    raise DataError(f"{data_dir} has no split {split!r}")
  return manifest["splits"][split]["tokens"] // (seq_len + 1)


def make_train_iterator(data_dir: str, seq_len: int, global_batch_size: int, seed: int,
                        process_index: int = 0, process_count: int = 1,
                        verify: str = "size", read_threads: int = READ_THREADS, prefetch: int = PREFETCH):
  """Infinite iterator of {'tokens', 'segment'}: int32 [global_batch_size // process_count,
  seq_len + 1], this process's rows of each global batch. A grain.DatasetIterator, so
  `get_state()` / `set_state(state)` checkpoint it. `verify='sha256'` hashes every shard first.
  `read_threads` = 0 reads in the calling thread (the same batches, later).
  """
  import grain

  rows = _local_rows(global_batch_size, process_index, process_count, "global_batch_size")
  if not 0 <= seed < 2**32:
    raise ConfigError(f"data seed={seed} must be in [0, 2**32)")
  manifest, tokens, n = _open_split(data_dir, "train", seq_len, verify)
  if n < global_batch_size:
    raise DataError(f"train split of {data_dir} has {n} windows of seq_len+1={seq_len + 1} tokens "
                    f"({tokens.num_tokens} tokens), fewer than one global batch of "
                    f"{global_batch_size}; use more data or a smaller batch / seq_len")
  ds = (grain.MapDataset.range(n).shuffle(seed=seed).repeat()
        .batch(global_batch_size, drop_remainder=True)
        .map(_ReadRows(tokens, seq_len + 1, manifest["eos_id"], rows, open_labels(data_dir, manifest, "train"),
                       open_extras(data_dir, manifest, "train"))))
  return iter(ds.to_iter_dataset(read_options(read_threads, prefetch)))


def read_options(read_threads: int, prefetch: int):
  """Grain's ReadOptions: `read_threads` workers keeping `prefetch` batches ready (0, 0: inline)."""
  import grain

  if read_threads < 0 or prefetch < 0 or (read_threads > 0) != (prefetch > 0):
    raise ConfigError(f"read_threads={read_threads}, prefetch={prefetch}: both 0 (read inline) or both positive")
  return grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=prefetch)


class EvalBatches:
  """A split's windows in order, in batches; the last batch padded (segment 0) to full shape.

  Re-iterable and sized. `batch_size` is global: process p gets rows [p B, (p+1) B) of each
  batch, as in training, so all processes run the same number of (static-shape) batches.
  """

  def __init__(self, tokens: SplitTokens, num_windows: int, seq_len: int, eos_id: int,
               batch_size: int, rows: slice, max_batches: int | None, labels=None, extras=None):
    self.tokens, self.n, self.window, self.eos_id = tokens, num_windows, seq_len + 1, eos_id
    self.labels, self.extras = labels, extras or {}
    self.batch_size, self.rows = batch_size, rows
    total = -(-num_windows // batch_size)
    self.num_batches = total if max_batches is None else min(total, max_batches)

  def __len__(self) -> int:
    return self.num_batches

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    local = self.rows.stop - self.rows.start
    for b in range(self.num_batches):
      first = b * self.batch_size + self.rows.start
      toks = np.full((local, self.window), self.eos_id, np.int32)
      real = max(0, min(local, self.n - first))
      if real:  # windows first .. first+real are contiguous: one read
        toks[:real] = self.tokens.read(first * self.window, real * self.window).reshape(real, -1)
      seg = segment_ids(toks, self.eos_id)
      seg[real:] = 0
      out = {"tokens": toks, "segment": seg}
      if self.labels is not None:
        lab, ignore = self.labels
        labels = np.full((local, self.window), -1, np.int32)
        if real:
          labels[:real] = _as_labels(lab.read(first * self.window, real * self.window).reshape(real, -1), ignore)
        out["labels"] = labels
      for name, (reader, width) in self.extras.items():
        arr = np.zeros((local, self.window, width), reader.out_dtype)
        if real:
          arr[:real] = _read_extra(reader, width, first * self.window, real * self.window).reshape(real, self.window, width)
        out[name] = arr
      yield out


def make_eval_batches(data_dir: str, split: str, seq_len: int, batch_size: int,
                      max_batches: int | None = None, process_index: int = 0,
                      process_count: int = 1, verify: str = "size") -> EvalBatches:
  """Deterministic evaluation batches over `split` (no shuffle), at most `max_batches`."""
  rows = _local_rows(batch_size, process_index, process_count, "batch_size")
  if max_batches is not None and max_batches <= 0:
    raise ConfigError(f"max_batches={max_batches} must be positive (or None for the whole split)")
  manifest, tokens, n = _open_split(data_dir, split, seq_len, verify)
  if n == 0:
    raise DataError(f"{split} split of {data_dir} has {tokens.num_tokens} tokens, less than one "
                    f"window of seq_len+1={seq_len + 1}; raise --val_fraction or use more data")
  return EvalBatches(tokens, n, seq_len, manifest["eos_id"], batch_size, rows, max_batches,
                     open_labels(data_dir, manifest, split), open_extras(data_dir, manifest, split))
