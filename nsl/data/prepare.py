"""`python -m nsl.data.prepare`: text sources -> token shards + manifest.json.

  python -m nsl.data.prepare --source=sotu --tokenizer=bpe --vocab_size=4096 --out=data/sotu-bpe4k

Output directory:
  manifest.json          what was prepared and how (see `prepare`), the only entry point readers use
  train_00000.bin ...    raw little-endian uint16 (vocab <= 65536) or uint32 token ids, each
  val_00000.bin ...      document followed by EOS; a split is the concatenation of its shards
  tokenizer.json / gpt2.tiktoken   files the tokenizer needs (bpe / gpt2), so the dir stands alone

The train/validation split is by document: document i (counted over all sources, in order) goes
to validation iff hash(seed, i) < val_fraction, so it does not depend on document contents or on
how many documents follow. When that selects none and there are >= 2 documents, the last
document goes to validation instead (an empty validation split is useless). Within a split,
documents keep corpus order.

Everything is written to a temporary sibling directory that is renamed into place at the end:
an interrupted run leaves no `out` (only a `.out.tmp-*` directory, removed on normal errors), so
a manifest never points at partial data.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Sequence

import numpy as np

from nsl.data import sources as sources_lib
from nsl.data import tokenizers as tok_lib
from nsl.errors import ArgumentParser, ConfigError, DataError, cli_main

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "val")
DEFAULT_SHARD_TOKENS = 1 << 24
DEFAULT_VOCAB_SIZE = 4096
DEFAULT_VAL_FRACTION = 0.01
_ENCODE_CHUNK = 64  # documents per encode_batch call: amortises per-call overhead, bounds memory
_FLUSH_TOKENS = 1 << 20  # tokens buffered per split before writing and counting them


def val_score(seed: int, index: int) -> float:
  """A uniform number in [0, 1) fixed by (seed, document index): < val_fraction -> validation."""
  digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0**64


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


class _ShardWriter:
  """Appends one split's documents to fixed-size shard files; hashes and (optionally) counts."""

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
    if self._pending_tokens >= _FLUSH_TOKENS:
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
    self._flush()
    if self._file is not None:
      self._close_shard()
    return {"documents": self.documents, "tokens": self.tokens, "shards": self.shards}


class _Progress:
  """A tqdm bar on a terminal; a plain line every 30 s otherwise (logs stay readable)."""

  def __init__(self, desc: str):
    self.tty = sys.stderr.isatty()
    self.desc, self.docs, self.tokens = desc, 0, 0
    self.t0 = self.last = time.time()
    self.bar = None
    if self.tty:
      from tqdm import tqdm

      self.bar = tqdm(desc=desc, unit="doc", file=sys.stderr, dynamic_ncols=True)

  def update(self, docs: int, tokens: int) -> None:
    self.docs += docs
    self.tokens += tokens
    if self.bar is not None:
      self.bar.update(docs)
      self.bar.set_postfix(tokens=f"{self.tokens:,}", refresh=False)
    elif time.time() - self.last > 30:
      self.last = time.time()
      print(f"{self.desc}: {self.docs:,} docs, {self.tokens:,} tokens, "
            f"{self.tokens / (self.last - self.t0):,.0f} tokens/s", file=sys.stderr, flush=True)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def _check_args(sources, tokenizer, vocab_size, val_fraction, seed, shard_tokens, max_docs):
  if not sources:
    raise ConfigError("no --source given; e.g. --source=sotu or --source='texts/*.txt'")
  tok_lib.check_name(tokenizer)
  if not 0.0 <= val_fraction < 1.0:
    raise ConfigError(f"val_fraction={val_fraction} must be in [0, 1)")
  if not isinstance(seed, int) or seed < 0:
    raise ConfigError(f"seed={seed!r} must be a non-negative integer")
  if shard_tokens <= 0:
    raise ConfigError(f"shard_tokens={shard_tokens} must be positive")
  if max_docs is not None and max_docs <= 0:
    raise ConfigError(f"max_docs={max_docs} must be positive (or omitted for all documents)")
  if tokenizer == "bpe" and not 257 <= vocab_size <= 1 << 20:
    raise ConfigError(f"vocab_size={vocab_size} for the bpe tokenizer must be in [257, 2**20]")
  for spec in sources:
    sources_lib.check_source(spec)


def _build_tokenizer(name, vocab_size, gpt2_bpe, sources, val_fraction, seed, max_docs):
  if name == "byte":
    return tok_lib.ByteTokenizer()
  if name == "gpt2":
    return tok_lib.Gpt2Tokenizer.locate(gpt2_bpe)
  # BPE learns from training documents only, so validation text stays unseen.
  docs = (d for i, d in enumerate(sources_lib.iter_documents(sources, max_docs))
          if val_score(seed, i) >= val_fraction)
  print(f"prepare: training a {vocab_size}-token BPE on the train documents", file=sys.stderr)
  return tok_lib.BpeTokenizer.train(docs, vocab_size)


def unigram_entropy_nats(counts: np.ndarray) -> float | None:
  """Entropy of the token frequency distribution, nats/token (an NLL a model must beat)."""
  total = counts.sum()
  if total == 0:
    return None  # no train tokens (JSON has no NaN)
  p = counts[counts > 0] / total
  return float(-(p * np.log(p)).sum())


def _tokenize_into(tmp_dir, tokenizer, sources, val_fraction, seed, shard_tokens, max_docs):
  dtype = token_dtype(tokenizer.vocab_size)
  train = _ShardWriter(tmp_dir, "train", dtype, shard_tokens, count_vocab=tokenizer.vocab_size)
  val = _ShardWriter(tmp_dir, "val", dtype, shard_tokens)
  # While validation is empty, the latest train doc is held back one step: if no document ever
  # hashes into validation, that last one becomes it. Holding only the latest keeps corpus order.
  held = None
  progress = _Progress("prepare")
  eos = np.array([tokenizer.eos_id], np.int64)

  def place(index: int, ids: list[int]) -> None:
    nonlocal held
    doc = np.concatenate([np.asarray(ids, np.int64), eos])
    if held is not None:
      train.add(held)
      held = None
    if val_score(seed, index) < val_fraction:
      val.add(doc)
    elif val.documents == 0 and val_fraction > 0:
      held = doc
    else:
      train.add(doc)

  index, chunk = 0, []

  def encode_chunk() -> None:
    nonlocal index
    for ids in tokenizer.encode_batch(chunk):
      place(index, ids)
      index += 1
      progress.update(1, len(ids) + 1)
    chunk.clear()

  try:
    for doc in sources_lib.iter_documents(sources, max_docs):
      chunk.append(doc)
      if len(chunk) == _ENCODE_CHUNK:
        encode_chunk()
    encode_chunk()
  finally:
    progress.close()
  if held is not None:
    (val if train.documents >= 1 else train).add(held)
  if index == 0:
    raise DataError(f"sources {list(sources)} hold no (non-empty) documents")
  return train, val, dtype


def _read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise DataError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); delete the "
                    "directory and re-run nsl.data.prepare") from None


def load_manifest(data_dir: str) -> dict:
  """The manifest of a prepared data directory (DataError if missing, invalid or too new)."""
  path = os.path.join(data_dir, MANIFEST)
  if not os.path.isfile(path):
    what = "does not exist" if not os.path.isdir(data_dir) else f"has no {MANIFEST}"
    raise DataError(f"data dir {data_dir} {what}; run `python -m nsl.data.prepare "
                    f"--source=... --out={data_dir}` first")
  manifest = _read_json(path)
  if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    raise DataError(f"{path} has format_version {version!r}, this nsl reads {FORMAT_VERSION}; "
                    "re-run nsl.data.prepare")
  for key in ("tokenizer", "vocab_size", "eos_id", "dtype", "splits"):
    if key not in manifest:
      raise DataError(f"{path} lacks {key!r}; re-run nsl.data.prepare")
  _check_manifest_shape(path, manifest)
  return manifest


def _check_manifest_shape(path: str, manifest: dict) -> None:
  """Every key readers index: a damaged or hand-edited manifest is one DataError, not a KeyError."""
  fix = "re-run nsl.data.prepare (with --force) to rebuild the directory"
  try:
    np.dtype(manifest["dtype"])
  except TypeError:
    raise DataError(f"{path}: dtype {manifest['dtype']!r} is not a numpy dtype; {fix}") from None
  for key in ("vocab_size", "eos_id"):
    if not isinstance(manifest[key], int) or isinstance(manifest[key], bool):
      raise DataError(f"{path}: {key}={manifest[key]!r} must be an integer; {fix}")
  splits = manifest["splits"]
  if not isinstance(splits, dict) or "train" not in splits:
    raise DataError(f"{path}: 'splits' must map split names (train, val) to their shards; {fix}")
  for name, split in splits.items():
    if not isinstance(split, dict):
      raise DataError(f"{path}: split {name!r} is not an object; {fix}")
    for key in ("tokens", "shards"):
      if key not in split:
        raise DataError(f"{path}: split {name!r} lacks {key!r}; {fix}")
    shard_lists = [("shards", split["shards"])]
    if "label_shards" in split:
      shard_lists.append(("label_shards", split["label_shards"]))
      if "label_ignore" not in manifest:
        raise DataError(f"{path}: split {name!r} has label_shards but the manifest lacks 'label_ignore'; {fix}")
    for extra, spec in (split.get("extra_shards") or {}).items():
      shard_lists.append((f"extra_shards.{extra}", (spec or {}).get("shards")))
    for list_name, shards in shard_lists:
      if not isinstance(shards, list):
        raise DataError(f"{path}: split {name!r} {list_name} must be a list of shards; {fix}")
      for i, shard in enumerate(shards):
        missing = [k for k in ("file", "tokens", "bytes") if not isinstance(shard, dict) or k not in shard]
        if missing:
          raise DataError(f"{path}: split {name!r} {list_name}[{i}] lacks {', '.join(map(repr, missing))}; {fix}")


def _sha256_file(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 22), b""):
      h.update(chunk)
  return h.hexdigest()


def verify_shards(data_dir: str, manifest: dict, split: str, full_checksum: bool = False) -> None:
  """Checks a split's shards exist with the recorded sizes (and sha256 when `full_checksum`)."""
  if split not in manifest["splits"]:
    raise DataError(f"{os.path.join(data_dir, MANIFEST)} has no split {split!r} "
                    f"(has {sorted(manifest['splits'])})")
  for shard in manifest["splits"][split]["shards"]:
    path = os.path.join(data_dir, shard["file"])
    size = os.path.getsize(path) if os.path.isfile(path) else None
    if size is None:
      raise DataError(f"corrupt shard {path}: file missing; re-run nsl.data.prepare")
    if size != shard["bytes"]:
      raise DataError(f"corrupt shard {path}: expected {shard['bytes']} bytes, found {size}; "
                      "re-run nsl.data.prepare")
    if full_checksum:
      digest = _sha256_file(path)
      if digest != shard.get("sha256"):
        raise DataError(f"corrupt shard {path}: sha256 {digest[:12]}... differs from the "
                        f"manifest's {str(shard.get('sha256'))[:12]}...; re-run nsl.data.prepare")


def _mismatch(manifest: dict, sources, tokenizer, vocab_size, val_fraction, seed, max_docs) -> str:
  """'' when the manifest was prepared with these settings, else the first difference."""
  spec = manifest.get("tokenizer", {})
  wanted = {"sources": list(sources), "tokenizer": tokenizer, "val_fraction": val_fraction,
            "seed": seed, "max_docs": max_docs}
  found = {"sources": manifest.get("sources"), "tokenizer": spec.get("name"),
           "val_fraction": manifest.get("val_fraction"), "seed": manifest.get("seed"),
           "max_docs": manifest.get("max_docs")}
  if tokenizer == "bpe":
    wanted["vocab_size"] = vocab_size
    found["vocab_size"] = spec.get("requested_vocab_size")
  for key, value in wanted.items():
    if found[key] != value:
      return f"{key}={found[key]!r} there, {value!r} requested"
  return ""


def _install(tmp_dir: str, out_dir: str, force: bool) -> None:
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


def prepare(out_dir: str, sources: Sequence[str], tokenizer: str = "byte",
            vocab_size: int = DEFAULT_VOCAB_SIZE, gpt2_bpe: str | None = None,
            val_fraction: float = DEFAULT_VAL_FRACTION, seed: int = 0,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, max_docs: int | None = None,
            force: bool = False) -> dict:
  """Tokenizes `sources` into `out_dir` (see the module docstring); returns the manifest."""
  sources = list(sources)
  _check_args(sources, tokenizer, vocab_size, val_fraction, seed, shard_tokens, max_docs)
  out_dir = os.path.abspath(out_dir)
  if os.path.isfile(os.path.join(out_dir, MANIFEST)):
    if not force:
      raise DataError(f"{out_dir} is already prepared; pass --force to rebuild it")
  elif os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
    # Never replace (even with --force) something that is not a prepared data dir.
    raise DataError(f"--out={out_dir} exists and is not a prepared data dir; choose another --out")
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
  umask = os.umask(0o022)
  os.umask(umask)
  os.chmod(tmp_dir, 0o777 & ~umask)  # mkdtemp's 0700 would hide the data from other users
  t0 = time.time()
  try:
    tok = _build_tokenizer(tokenizer, vocab_size, gpt2_bpe, sources, val_fraction, seed, max_docs)
    tok.save(tmp_dir)
    train, val, dtype = _tokenize_into(tmp_dir, tok, sources, val_fraction, seed, shard_tokens,
                                       max_docs)
    splits = {"train": train.close(), "val": val.close()}  # close first: it flushes and counts
    manifest = {
        "format_version": FORMAT_VERSION,
        "sources": sources,
        "max_docs": max_docs,
        "seed": seed,
        "val_fraction": val_fraction,
        "tokenizer": tok.spec(),
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": dtype.name,  # stored little-endian whatever the host
        "shard_tokens": shard_tokens,
        "unigram_entropy_nats": unigram_entropy_nats(train.counts),
        "splits": splits,
        "prepare_seconds": round(time.time() - t0, 3),
    }
    with open(os.path.join(tmp_dir, MANIFEST), "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=1)
      f.flush()
      os.fsync(f.fileno())
    try:
      _install(tmp_dir, out_dir, force)
    except (DataError, OSError):
      # Someone else (another host on a shared disk) finished first: theirs is as good as ours.
      if os.path.isfile(os.path.join(out_dir, MANIFEST)):
        other = load_manifest(out_dir)
        if not _mismatch(other, sources, tokenizer, vocab_size, val_fraction, seed, max_docs):
          return other
      raise
    return manifest
  finally:
    shutil.rmtree(tmp_dir, ignore_errors=True)


def ensure_prepared(out_dir: str, sources: Sequence[str], tokenizer: str,
                    vocab_size: int = DEFAULT_VOCAB_SIZE, gpt2_bpe: str | None = None,
                    val_fraction: float = DEFAULT_VAL_FRACTION, seed: int = 0,
                    max_docs: int | None = None,
                    shard_tokens: int = DEFAULT_SHARD_TOKENS) -> dict:
  """The manifest of `out_dir`, preparing it first if needed.

  An existing manifest is reused when it was made from the same sources, tokenizer (and BPE
  vocab_size), val_fraction, seed and max_docs; otherwise DataError: silently training on other
  data than the config names would change the experiment. Planning-task sources
  (`task:path_star:...`, `task:countdown:...`) are generated by `nsl.data.tasks.task_data`.
  """
  from nsl.data.tasks import task_data

  if task_data.is_task_source(sources):
    return task_data.ensure_task_prepared(out_dir, list(sources))
  if os.path.isfile(os.path.join(out_dir, MANIFEST)):
    manifest = load_manifest(out_dir)
    diff = _mismatch(manifest, sources, tokenizer, vocab_size, val_fraction, seed, max_docs)
    if diff:
      raise DataError(f"data dir {out_dir} was prepared differently ({diff}); use another "
                      "data dir, or rebuild this one with nsl.data.prepare --force")
    return manifest
  return prepare(out_dir, sources, tokenizer, vocab_size=vocab_size, gpt2_bpe=gpt2_bpe,
                 val_fraction=val_fraction, seed=seed, shard_tokens=shard_tokens,
                 max_docs=max_docs)


def _parser() -> ArgumentParser:
  p = ArgumentParser(prog="python -m nsl.data.prepare", description=__doc__.split("\n")[0])
  p.add_argument("--source", action="append", required=True,
                 help="sotu | PATH/GLOB | jsonl:PATH[:FIELD] | hf:NAME[:CONFIG]:SPLIT[:FIELD] | "
                      "tfds:NAME:SPLIT[:FIELD]; repeat for several")
  p.add_argument("--tokenizer", default="byte", choices=tok_lib.NAMES)
  p.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE, help="bpe only")
  p.add_argument("--gpt2_bpe", default=None,
                 help=f"gpt2 ranks file (default: ${tok_lib.GPT2_BPE_ENV}, else tiktoken download)")
  p.add_argument("--out", required=True)
  p.add_argument("--val_fraction", type=float, default=DEFAULT_VAL_FRACTION)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--shard_tokens", type=int, default=DEFAULT_SHARD_TOKENS)
  p.add_argument("--max_docs", type=int, default=None)
  p.add_argument("--force", action="store_true", help="rebuild an existing data dir")
  return p


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  out = os.path.join(args.out, MANIFEST)
  if os.path.isfile(out) and not args.force:
    m = ensure_prepared(args.out, args.source, args.tokenizer, vocab_size=args.vocab_size,
                        val_fraction=args.val_fraction, seed=args.seed, max_docs=args.max_docs)
    print(f"{args.out} is already prepared with these settings (pass --force to rebuild)",
          file=sys.stderr)
  else:
    m = prepare(args.out, args.source, args.tokenizer, vocab_size=args.vocab_size,
                gpt2_bpe=args.gpt2_bpe, val_fraction=args.val_fraction, seed=args.seed,
                shard_tokens=args.shard_tokens, max_docs=args.max_docs, force=args.force)
  tr, va = m["splits"]["train"], m["splits"]["val"]
  print(json.dumps({"out": args.out, "tokenizer": m["tokenizer"]["name"],
                    "vocab_size": m["vocab_size"], "train_documents": tr["documents"],
                    "train_tokens": tr["tokens"], "val_documents": va["documents"],
                    "val_tokens": va["tokens"], "shards": len(tr["shards"]) + len(va["shards"]),
                    "unigram_entropy_nats": m["unigram_entropy_nats"],
                    "seconds": m.get("prepare_seconds")}))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
