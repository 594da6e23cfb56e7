"""Bytes per token of a prepared data dir's validation split, and bits per byte from nats per token
(docs/guide/scaling.md, "Records").

bits/byte = (nats/token) / ln 2 / (bytes/token). Bytes per token is measured on the validation
split as the evaluation scores it: each document's tokens are decoded back to text by the data
dir's own tokenizer and counted as UTF-8 bytes, over the number of scored targets (every token of a
document and its EOS, less the document's first token, which is only context). The first
`MAX_TOKENS` tokens of the split are read; the result is cached beside the manifest
(`val_bytes_per_token.json`) on first use, or recomputed each time when the dir is read-only.
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


def _measure(data_dir: str, manifest: dict, max_tokens: int) -> dict | None:
  spec = manifest.get("tokenizer")
  if not isinstance(spec, dict) or spec.get("name") not in tok_lib.NAMES or "val" not in manifest["splits"]:
    return None
  tok = tok_lib.load_tokenizer(spec, data_dir)
  split = SplitTokens(data_dir, manifest, "val")
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


def val_bytes_per_token(data_dir: str, max_tokens: int = MAX_TOKENS) -> float | None:
  """UTF-8 bytes per scored validation token of `data_dir` (module docstring); None when the dir
  has no text tokenizer. Cached in DATA_DIR/val_bytes_per_token.json."""
  path = os.path.join(data_dir, CACHE)
  manifest = load_manifest(data_dir)
  stamp = {"splits_val": manifest["splits"].get("val"), "max_tokens": max_tokens}
  try:
    with open(path, encoding="utf-8") as f:
      cached = json.load(f)
    if cached.get("stamp") == json.loads(json.dumps(stamp)):
      return cached["measure"]["bytes_per_token"] if cached["measure"] else None
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    pass
  measure = _measure(data_dir, manifest, max_tokens)
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump({"stamp": stamp, "measure": measure}, f)
    os.replace(tmp, path)
  except OSError:  # a read-only data dir: measured again next time
    with contextlib.suppress(OSError):
      os.remove(tmp)
  return measure["bytes_per_token"] if measure else None


def bits_per_byte(nats_per_token: float, bytes_per_token: float) -> float:
  return nats_per_token / math.log(2.0) / bytes_per_token


def record_fields(data_dir: str, evals: dict) -> dict:
  """The result.json fields for bits per byte: `val_bytes_per_token` and `eval_bits_per_byte`
  (the eval dict's splits in bits per byte); {} when the data has no bytes or cannot be read."""
  try:
    bpt = val_bytes_per_token(data_dir)
  except (DataError, OSError, ValueError, KeyError):
    return {}
  if not bpt:
    return {}
  return {"val_bytes_per_token": bpt,
          "eval_bits_per_byte": {k: bits_per_byte(v, bpt) for k, v in evals.items()
                                 if isinstance(v, (int, float)) and math.isfinite(v)}}
