"""`python -m nsl.bench.train_step --config=... [--batch=4] [--seq_len=512] [--steps=5]`

Times the real jitted train step of a config on random tokens and prints one JSON line: compile
time, step time, tokens/s, achieved GFLOP/s (analytic training FLOPs / step time, the convention
of `nsl.train.loop.FLOPS_CONVENTION`), peak host memory, and, measured in the same process, the
machine's own fp32 matmul throughput (2048 x 2048 x 2048) as the ceiling, sampled after every
timed step so both see the same load, with the median of the per-step ratios.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time

from nsl import hostmem
from nsl.errors import ArgumentParser, cli_main


class MatmulCeiling:
  """Achieved FLOP/s of a jitted n x n x n fp32 matmul: the machine's own ceiling.

  Sampled between the timed train steps (side by side), so both see the same machine load.
  """

  def __init__(self, n: int = 2048):
    import jax
    import jax.numpy as jnp

    self.n = n
    self.a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    self.b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
    self.f = jax.jit(lambda x, y: x @ y)
    self.f(self.a, self.b).block_until_ready()
    self.samples: list[float] = []

  def sample(self, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      self.f(self.a, self.b).block_until_ready()
      times.append(time.perf_counter() - t0)
    flops = 2 * self.n**3 / min(times)
    self.samples.append(flops)
    return flops


@cli_main
def main(argv: list[str] | None = None) -> int:
  parser = ArgumentParser(prog="python -m nsl.bench.train_step")
  parser.add_argument("--config", required=True, help="config file, or FILE.py:ARG (configs/sps.py:xs)")
  parser.add_argument("--batch", type=int, default=None, help="global batch (default: the config's)")
  parser.add_argument("--seq_len", type=int, default=None, help="tokens per row (default: the config's)")
  parser.add_argument("--steps", type=int, default=5, help="timed steps after the compile step")
  args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)

  import jax
  import numpy as np

  from nsl import config as nsl_config, sharding
  from nsl.train import program as program_lib

  overrides, _ = nsl_config.split_overrides(rest)
  config = nsl_config.load_config(args.config, overrides)
  if args.batch:
    config.train.batch_size = args.batch
  if args.seq_len:
    config.data.seq_len = args.seq_len
    if config.model.window is not None:
      config.model.window = min(config.model.window, args.seq_len)
  ceiling = MatmulCeiling()
  # The launcher's own program (nsl.train.program): the step timed is the step trained.
  prog = program_lib.Program(config, jax.devices())
  family, mesh = prog.family, prog.mesh
  b, t = config.train.batch_size, config.data.seq_len
  rng = np.random.default_rng(0)
  host_batch = family.dummy_batch(b)
  host_batch = {k: np.asarray(v) for k, v in host_batch.items()}
  host_batch["tokens"] = rng.integers(0, config.model.vocab_size, size=host_batch["tokens"].shape, dtype=np.int32)
  step = prog.train_step
  with prog.mesh_context():
    state = prog.init(jax.random.PRNGKey(0))
    batch = sharding.global_batch(host_batch, mesh)
    key = jax.random.PRNGKey(1)
    t0 = time.perf_counter()
    compiled = step.lower(state, batch, key, prog.schedule).compile()
    compile_s = time.perf_counter() - t0
    state, m = compiled(state, batch, key, prog.schedule)  # warm-up
    jax.block_until_ready(m)
    times, ratios = [], []
    flops = family.flops_per_token() * b * t
    for _ in range(args.steps):
      t0 = time.perf_counter()
      state, m = compiled(state, batch, key, prog.schedule)
      jax.block_until_ready(m)
      times.append(time.perf_counter() - t0)
      ratios.append(flops / times[-1] / ceiling.sample())
  step_s = statistics.median(times)
  tokens = b * t
  achieved = flops / step_s
  print(json.dumps({
      "config": args.config, "family": config.family, "variant": config.model.variant,
      "batch": b, "seq_len": t, "tokens_per_step": tokens, "params_total": family.param_counts()["params_total"],
      "devices": jax.device_count(), "backend": sharding.platform(), "host_huge_pages": hostmem.status(),
      "compile_sec": round(compile_s, 3), "step_sec": round(step_s, 4), "step_sec_all": [round(x, 4) for x in times],
      "tokens_per_sec": round(tokens / step_s, 1), "flops_per_step": flops,
      "achieved_gflops": round(achieved / 1e9, 2),
      "matmul_ceiling_gflops": round(statistics.median(ceiling.samples) / 1e9, 2),
      # median over steps of (step FLOP/s / the matmul FLOP/s sampled right after that step)
      "fraction_of_ceiling": round(statistics.median(ratios), 3),
      "fraction_of_ceiling_all": [round(r, 3) for r in ratios],
      "peak_host_memory_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
      "final_loss": float(m["loss"]),
  }, sort_keys=True))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
