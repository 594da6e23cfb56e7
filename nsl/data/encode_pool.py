"""Tokenizing a document stream in batches, in this process or in N worker processes, in order.

`encode_stream` cuts the documents into batches (at most `CHUNK_DOCS` documents or `CHUNK_CHARS`
characters) and yields each batch's token ids as one flat uint32 array plus the per-document
lengths, in document order whatever order the workers finish in: the ids of a document depend
only on its text and the tokenizer, so the output is the same for any worker count
(docs/guide/data.md#prepare-workers). At most `2 x workers` batches are in flight, so memory stays
flat however long the stream is (a `Pool.imap` would read the whole stream ahead into its queue).

Workers fork from a fresh forkserver process (not from the parent, which may hold JAX's threads;
`_start_server`) and rebuild the tokenizer
from the files `prepare` already wrote (`load_tokenizer(spec, dir)`); each encodes on one thread
(`RAYON_NUM_THREADS=1` for the HF BPE, `batch_threads = 1` for tiktoken), so N workers use N cores.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import os
import time
from typing import Iterable, Iterator

import numpy as np

from nsl.data import tokenizers as tok_lib

CHUNK_DOCS = 256
CHUNK_CHARS = 1 << 20

_worker_tok = None
# CPU seconds the workers spent encoding (each batch reports its own), summed in the parent:
# `nsl.bench.prepare` compares tokens per worker CPU-second with the one-core ceiling.
STATS = {"worker_cpu_sec": 0.0}


def chunks(docs: Iterable[str], max_docs: int | None = None, max_chars: int | None = None) -> Iterator[list[str]]:
  """Consecutive batches of documents, each at most max_docs (CHUNK_DOCS) documents or about
  max_chars (CHUNK_CHARS) characters."""
  max_docs, max_chars = max_docs or CHUNK_DOCS, max_chars or CHUNK_CHARS
  batch, chars = [], 0
  for doc in docs:
    batch.append(doc)
    chars += len(doc)
    if len(batch) >= max_docs or chars >= max_chars:
      yield batch
      batch, chars = [], 0
  if batch:
    yield batch


def _flatten(ids_per_doc: list) -> tuple[np.ndarray, np.ndarray]:
  lengths = np.fromiter((len(ids) for ids in ids_per_doc), np.int64, count=len(ids_per_doc))
  flat = np.fromiter(itertools.chain.from_iterable(ids_per_doc), np.uint32, count=int(lengths.sum()))
  return flat, lengths


def encode_batch(tok, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
  """(flat uint32 ids of all documents, int64 length of each)."""
  return _flatten(tok.encode_batch(texts))


def _init_worker(spec: dict, tok_dir: str) -> None:
  global _worker_tok
  os.environ["RAYON_NUM_THREADS"] = "1"  # read by the HF tokenizers' thread pool when it starts
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  _worker_tok = tok_lib.load_tokenizer(spec, tok_dir)
  if isinstance(_worker_tok, tok_lib.Gpt2Tokenizer):
    _worker_tok.batch_threads = 1


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray, float]:
  t0 = time.process_time()
  flat, lengths = encode_batch(_worker_tok, texts)
  return flat, lengths, time.process_time() - t0


def _collect(result: tuple[np.ndarray, np.ndarray, float]) -> tuple[np.ndarray, np.ndarray]:
  STATS["worker_cpu_sec"] += result[2]
  return result[0], result[1]


def _start_server(ctx) -> None:
  """Starts the workers' forkserver (once per process), which imports this module for them all.
  It starts with JAX_PLATFORMS set, so `import nsl` skips its TPU probe and does not load JAX
  (0.2 s instead of seconds); workers inherit it and never touch JAX."""
  from multiprocessing import forkserver

  ctx.set_forkserver_preload([__name__])
  if os.environ.get("JAX_PLATFORMS"):
    forkserver.ensure_running()
    return
  os.environ["JAX_PLATFORMS"] = "cpu"  # for the server's environment only: restored at once
  try:
    forkserver.ensure_running()
  finally:
    del os.environ["JAX_PLATFORMS"]


def encode_stream(docs: Iterable[str], tok, workers: int = 1, spec: dict | None = None,
                  tok_dir: str | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(flat ids, lengths) per batch of `docs`, in order. workers <= 1: in this process with `tok`;
  else `workers` processes that load the tokenizer from (spec, tok_dir)."""
  if workers <= 1:
    for texts in chunks(docs):
      yield encode_batch(tok, texts)
    return
  ctx = multiprocessing.get_context("forkserver")
  _start_server(ctx)
  pool = ctx.Pool(workers, initializer=_init_worker, initargs=(spec, tok_dir))
  try:
    pending: collections.deque = collections.deque()
    for texts in chunks(docs):
      pending.append(pool.apply_async(_encode_in_worker, (texts,)))
      if len(pending) >= 2 * workers:
        yield _collect(pending.popleft().get())
    while pending:
      yield _collect(pending.popleft().get())
  finally:
    pool.terminate()
    pool.join()
