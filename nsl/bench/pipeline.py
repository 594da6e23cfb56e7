"""`python -m nsl.bench.pipeline`: the input pipeline's tokens/s beside the train step's consumption.

  python -m nsl.bench.pipeline [--config=configs/tiny.py] [--batches=200] [--steps=5] [--config.a.b=V ...]

Prints one JSON object for the config's data dir (prepared first if missing, as training would):
tokens/s of `pipeline.make_train_iterator` reading and packing `--batches` batches inline
(`read_threads` 0) and on Grain's worker threads with prefetch (nsl's default), and the train
step's consumption, tokens/s of the compiled step of the same config (`nsl.train.program`, the
step `nsl.launch` runs) on a batch from that pipeline. `pipeline_over_step` above 1 means the
pipeline outruns the step, so the step never waits for data (docs/benchmarks.md#current).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Sequence

from nsl.errors import ArgumentParser, ConfigError, cli_main


def pipeline_tokens_per_sec(config, batches: int, read_threads: int, prefetch: int) -> float:
  """Tokens/s of the train iterator over `batches` batches, after its first (opening the shards)."""
  from nsl.data import pipeline

  it = pipeline.make_train_iterator(config.data.path, seq_len=config.data.seq_len,
                                    global_batch_size=config.train.batch_size, seed=config.seed,
                                    verify=config.data.verify, read_threads=read_threads, prefetch=prefetch)
  next(it)
  t0 = time.perf_counter()
  for _ in range(batches):
    next(it)
  return batches * config.train.batch_size * config.data.seq_len / (time.perf_counter() - t0)


def step_tokens_per_sec(config, steps: int) -> tuple[float, float]:
  """(tokens/s of the compiled train step, compile seconds) on one batch of the config's data."""
  import jax

  from nsl import sharding
  from nsl.data import pipeline
  from nsl.train import program as program_lib

  prog = program_lib.Program(config, jax.devices())
  host = next(pipeline.make_train_iterator(config.data.path, seq_len=config.data.seq_len,
                                           global_batch_size=config.train.batch_size, seed=config.seed))
  with prog.mesh_context():
    state = prog.init(jax.random.PRNGKey(0))
    batch, key = sharding.global_batch(host, prog.mesh), jax.random.PRNGKey(1)
    t0 = time.perf_counter()
    compiled = prog.train_step.lower(state, batch, key, prog.schedule).compile()
    compile_s = time.perf_counter() - t0
    state, m = compiled(state, batch, key, prog.schedule)
    jax.block_until_ready(m)
    times = []
    for _ in range(steps):
      t0 = time.perf_counter()
      state, m = compiled(state, batch, key, prog.schedule)
      jax.block_until_ready(m)
      times.append(time.perf_counter() - t0)
  return config.train.batch_size * config.data.seq_len / statistics.median(times), compile_s


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
  parser = ArgumentParser(prog="python -m nsl.bench.pipeline", description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/tiny.py",
                      help="config file, or FILE.py:ARG, whose data pipeline is timed")
  parser.add_argument("--batches", type=int, default=200, help="batches timed per pipeline setting")
  parser.add_argument("--steps", type=int, default=5, help="train steps timed (median) after the compile step")
  args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
  if args.batches < 1 or args.steps < 1:
    raise ConfigError(f"--batches={args.batches} and --steps={args.steps} must be positive")

  from nsl import config as nsl_config
  from nsl.data import pipeline
  from nsl.train import loop

  overrides, _ = nsl_config.split_overrides(rest)
  config = nsl_config.load_config(args.config, overrides)
  loop.prepare_data(config)
  inline = pipeline_tokens_per_sec(config, args.batches, 0, 0)
  threaded = pipeline_tokens_per_sec(config, args.batches, pipeline.READ_THREADS, pipeline.PREFETCH)
  step, compile_s = step_tokens_per_sec(config, args.steps)
  print(json.dumps({
      "config": args.config, "data": config.data.path, "batch": config.train.batch_size,
      "seq_len": config.data.seq_len,
      "pipeline_inline_tokens_per_sec": round(inline),
      "pipeline_tokens_per_sec": round(threaded),
      "read_threads": pipeline.READ_THREADS, "prefetch": pipeline.PREFETCH,
      "train_step_tokens_per_sec": round(step), "compile_sec": round(compile_s, 2),
      "pipeline_over_step": round(threaded / step, 1),
  }))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
