"""Bytes per token of a prepared data dir's validation split, and bits per byte from nats per token
(docs/guide/scaling.md, "Records").

bits/byte = (nats/token) / ln 2 / (bytes/token). Bytes per token is measured on the validation
split as the evaluation scores it: each document's tokens are decoded back to text by the data
dir's own tokenizer and counted as UTF-8 bytes, over the number of scored targets (every token of a
document and its EOS, less the document's first token, which is only context). The first
`MAX_TOKENS` tokens of the split are read; the result is cached beside the manifest
(`val_bytes_per_token.json`, `<split>_bytes_per_token.json` for another split) on first use, or
recomputed each time when the dir is read-only.
Data dirs of labelled tasks (no text tokenizer) have no bytes: None.
"""

from __future__ import annotations

import contextlib
import json
import math
import os

import numpy as np

from nsl.data import tokenizers as tok_lib
from nsl.data.datadir import load_manifest
from nsl.data.pipeline import SplitTokens
from nsl.errors import DataError

CACHE = "val_bytes_per_token.json"
MAX_TOKENS = 2_000_000


def _measure(data_dir: str, manifest: dict, max_tokens: int, split_name: str = "val") -> dict | None:
  spec = manifest.get("tokenizer")
  if not isinstance(spec, dict) or spec.get("name") not in tok_lib.NAMES or split_name not in manifest["splits"]:
    return None
  tok = tok_lib.load_tokenizer(spec, data_dir)
  split = SplitTokens(data_dir, manifest, split_name)
  ids = split.read(0, min(split.num_tokens, max_tokens))
  eos = int(manifest["eos_id"])
  ends = np.flatnonzero(ids == eos)
  n_bytes = n_targets = 0
  start = 0
  for end in ends:  # a trailing piece without its EOS (cut by max_tokens) is left out
    doc = ids[start:end]
    if len(doc):
      n_bytes += len(tok.decode(doc.tolist()).encode("utf-8"))
      n_targets += len(doc)  # the doc's tokens and its EOS are len(doc) + 1; the first is context
    start = end + 1
  if n_targets == 0:
    return None
  return {"bytes": n_bytes, "targets": n_targets, "tokens_read": int(len(ids)),
          "bytes_per_token": n_bytes / n_targets, "tokenizer": spec.get("name")}


def cache_file(split: str) -> str:
  return CACHE if split == "val" else f"{split}_bytes_per_token.json"


def measure(data_dir: str, split: str = "val", max_tokens: int = MAX_TOKENS) -> dict | None:
  """{bytes, targets, tokens_read, bytes_per_token, tokenizer} of `split` (module docstring), None
  when the dir has no text tokenizer or no such split. Cached beside the manifest (`cache_file`)."""
  path = os.path.join(data_dir, cache_file(split))
  manifest = load_manifest(data_dir)
  stamp = {f"splits_{split}": manifest["splits"].get(split), "max_tokens": max_tokens}
  try:
    with open(path, encoding="utf-8") as f:
      cached = json.load(f)
    if cached.get("stamp") == json.loads(json.dumps(stamp)):
      return cached["measure"]
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    pass
  result = _measure(data_dir, manifest, max_tokens, split)
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump({"stamp": stamp, "measure": result}, f)
    os.replace(tmp, path)
  except OSError:  # a read-only data dir: measured again next time
    with contextlib.suppress(OSError):
      os.remove(tmp)
  return result


def val_bytes_per_token(data_dir: str, max_tokens: int = MAX_TOKENS) -> float | None:
  """UTF-8 bytes per scored validation token of `data_dir` (module docstring); None when the dir
  has no text tokenizer. Cached in DATA_DIR/val_bytes_per_token.json."""
  result = measure(data_dir, "val", max_tokens)
  return result["bytes_per_token"] if result else None


def bits_per_byte(nats_per_token: float, bytes_per_token: float) -> float:
  return nats_per_token / math.log(2.0) / bytes_per_token


def record_fields(data_dir: str, evals: dict) -> dict:
  """The result.json fields for bits per byte: `val_bytes_per_token`, `eval_bits_per_byte` (the
  eval dict's splits in bits per byte) and `val_byte_counts` (the UTF-8 bytes and scored targets
  of the measured text); {} when the data has no bytes or cannot be read."""
  try:
    counts = measure(data_dir, "val")
  except (DataError, OSError, ValueError, KeyError):
    return {}
  if not counts or not counts.get("bytes_per_token"):
    return {}
  bpt = counts["bytes_per_token"]
  return {"val_bytes_per_token": bpt,
          "val_byte_counts": {k: counts[k] for k in ("bytes", "targets", "tokens_read")},
          "eval_bits_per_byte": {k: bits_per_byte(v, bpt) for k, v in evals.items()
                                 if isinstance(v, (int, float)) and math.isfinite(v)}}


def eval_fields(data_dir: str, split: str, nats_per_token: float) -> dict:
  """An evaluation's bits-per-byte details (`nsl.evals.nll`'s eval_details): {bits_per_byte,
  bytes_per_token, bytes, byte_targets} of `split` (bytes and scored targets of the measured
  text, the split's first MAX_TOKENS tokens); {} when the data has no bytes or cannot be read."""
  try:
    counts = measure(data_dir, split)
  except (DataError, OSError, ValueError, KeyError):
    return {}
  if not counts or not counts.get("bytes_per_token") or not math.isfinite(nats_per_token):
    return {}
  return {"bits_per_byte": bits_per_byte(nats_per_token, counts["bytes_per_token"]),
          "bytes_per_token": counts["bytes_per_token"], "bytes": counts["bytes"], "byte_targets": counts["targets"]}
