"""What a checkpoint costs: the save of a config's train state, timed (docs/guide/pods.md#preemption).

  python -m nsl.bench.checkpoint --config=configs/tiny.py --dir=/tmp/ckpt [--repeats=3]
  python -m nsl.bench.checkpoint --config=configs/sps.py:xl --describe   # bytes only, no arrays

The train state is the parameters and Adam's two moments, all float32: 12 bytes a parameter
(`describe`: from shapes alone, so XL is costed in seconds). A save is timed as the trainer sees
it: `blocking_s`, until `Checkpointer.save` returns (an async save: the arrays' fingerprint,
`nsl.fingerprint`, the copy off the devices and the start of the write), and `total_s`, until the
write is committed; `fingerprint_s` times the fingerprint alone, the part of `blocking_s` that
checks a restore. `--dir` may be a gs://
bucket (an emulator through STORAGE_EMULATOR_HOST). One JSON line per save, then a summary with
the measured write throughput and the seconds a state of `--bytes_for` (default: the config's own)
would take at it: what `checkpoint.every_minutes` adds to a preemption's loss.
"""

from __future__ import annotations

import json
import sys
import time

from nsl.errors import ArgumentParser, ConfigError, cli_main

STATE_BYTES_PER_PARAM = 12  # float32 parameters + Adam's mu and nu


def state_bytes(config) -> int:
  from nsl.train import loop
  return int(loop.describe(config)["params_total"]) * STATE_BYTES_PER_PARAM


def _state(config):
  """A train state of the config's shapes (parameters as initialised, moments zero)."""
  import jax
  import jax.numpy as jnp
  from nsl.models import registry

  family = registry.get_family(config)
  params = jax.jit(family.init)(jax.random.PRNGKey(0))
  zeros = jax.tree.map(jnp.zeros_like, params)
  return {"params": params, "mu": zeros, "nu": jax.tree.map(jnp.zeros_like, params), "step": jnp.int32(0)}


def run(config, directory: str, repeats: int) -> list[dict]:
  import jax
  from nsl import checkpoint, fingerprint, storage

  state = _state(config)
  nbytes = sum(int(x.nbytes) for x in jax.tree.leaves(state))
  storage.rmtree(directory)
  ckpt = checkpoint.Checkpointer(directory, keep=1, async_save=True)
  rows = []
  try:
    for i in range(repeats):
      t0 = time.perf_counter()
      fingerprint.of(state)
      fingerprinted = time.perf_counter() - t0
      t0 = time.perf_counter()
      ckpt.save(i + 1, state, None, {}, force=True)
      blocking = time.perf_counter() - t0
      ckpt.wait()
      rows.append({"save": i + 1, "bytes": nbytes, "blocking_s": round(blocking, 4),
                   "total_s": round(time.perf_counter() - t0, 4), "fingerprint_s": round(fingerprinted, 4)})
      print(json.dumps(rows[-1]), flush=True)
  finally:
    ckpt.close()
  return rows


@cli_main
def main(argv: list[str] | None = None) -> int:
  p = ArgumentParser(prog="python -m nsl.bench.checkpoint", description=__doc__.split("\n\n")[0])
  p.add_argument("--config", required=True, help="config file, or FILE.py:ARG")
  p.add_argument("--dir", default=None, help="where to save (local or gs://); required unless --describe")
  p.add_argument("--repeats", type=int, default=3, help="saves timed (the first also warms up)")
  p.add_argument("--describe", action="store_true", help="print the state's bytes only (any size: shapes alone)")
  p.add_argument("--bytes_for", default=None, help="also cost a state of this config at the measured throughput")
  from nsl import config as nsl_config

  overrides, rest = nsl_config.split_overrides(sys.argv[1:] if argv is None else argv)
  args = p.parse_args(rest)
  config = nsl_config.load_config(args.config, overrides)
  if args.describe:
    print(json.dumps({"config": args.config, "state_bytes": state_bytes(config)}))
    return 0
  if not args.dir or args.repeats < 1:
    raise ConfigError("--dir is required (a scratch directory or gs:// prefix) and --repeats must be >= 1")
  rows = run(config, args.dir, args.repeats)
  best = min(rows[1:] or rows, key=lambda r: r["total_s"])
  summary = {"config": args.config, "dir": args.dir, "bytes": best["bytes"], "best_total_s": best["total_s"],
             "best_blocking_s": best["blocking_s"], "write_mb_per_s": round(best["bytes"] / best["total_s"] / 1e6, 1),
             "fingerprint_s": best["fingerprint_s"],
             "fingerprint_mb_per_s": round(best["bytes"] / max(best["fingerprint_s"], 1e-9) / 1e6, 1)}
  if args.bytes_for:
    other = state_bytes(nsl_config.load_config(args.bytes_for, []))
    summary.update(bytes_for=args.bytes_for, other_bytes=other,
                   other_total_s_at_this_rate=round(other / (best["bytes"] / best["total_s"]), 1))
  print(json.dumps(summary))
  return 0


if __name__ == "__main__":
  sys.exit(main())
