"""`python -m nsl.bench.decode --config=configs/X.py`: KV-cache generation per SPS variant, side by side.

For each variant (default: standard, sps, twox_memory, delayed_state, reverse_sps) the config's
model is built in family "sps" with that variant (randomly initialised from the config seed:
speed and memory do not depend on the weights), a batch of `--batch` random prompts of
`--prompt_len` tokens is prefilled and `--new_tokens` tokens are generated greedily with
`nsl.decode`. One JSON line per variant:

- `prefill_tokens_per_sec`, `decode_tokens_per_sec`: prompt (resp. generated) tokens of the whole
  batch over the best wall time of `--repeats` runs after one compile/warm-up call (`*_median`
  too); the variants are timed round-robin in one process, so their ratios are side by side:
  `decode_speed_vs_standard` (best over best) and `decode_speed_vs_standard_median` (the median of
  the per-round ratios, `..._by_round`);
- `kv_cache_bytes`: bytes of the cache arrays actually allocated for prompt + new tokens
  (persistent K/V, temporary ring K/V, slot metadata) and `kv_cache_vs_standard`;
- `expected_kv_vs_standard`: (T + w)/T for sps / delayed_state / reverse_sps, 2 for
  twox_memory, with T = prompt_len + new_tokens;
- `first_call_s`: the first prefill + decode, compile included; `compile_s`: its tracing,
  lowering and XLA compile alone, per program (the rest of the first call is the two runs);
- `peak_bytes`: the device allocator's peak when the backend reports one (GPU/TPU), and
  `decode_compiled_bytes`, XLA's own estimate for the compiled decode loop (arguments + outputs
  + temporaries − aliased), available on every backend.

Model-size and window overrides take the launcher's form: `--config.model.window=64`.

Other families: what the config's family decoder offers decides (`nsl.models.decoder.Decoder`).
A decoder with a draft model (NextLat's) compares plain and self-speculative decoding
(tokens/s, mean accepted tokens per draft; `--workdir=RUN` for a trained model, whose validation
rows give the prompts: for a planning task, `--prompt_len` = the task's prompt length and
`--new_tokens` = its answer length decode exactly the answers). `--draft_lens=2,4,6,8` sweeps the
draft length in one run (fixed draft lengths 2-10, docs/papers/nextlat.md#speculative-decoding):
per length a `plain` and a `speculative` line measured side by side (plain and speculative
alternating prompt by prompt), then one `sweep` line with the tokens per draft and the speed-up
against plain decoding for every length, and whether every greedy speculative output equalled
plain greedy decoding. `--temperature=T` samples instead (Leviathan acceptance; greedy text of a
small model loops, and loops draft easily: every line carries the plain outputs'
`distinct_token_fraction`). A decoder with its own `bench` runs it: the variant table above for
the standard and SPS families, the double decoder beside decoder-only at matched size
(`nsl.bench.dd_decode`: KV-cache bytes and decode tokens/s), LIFT's own-state feedback decode
beside `lift_no_states` (`nsl.bench.lift_decode`: every prompt token is a sequential step there).
Every family's lines carry `first_call_s`, the first prefill + decode with its compiles. A family
without a decoder (sed), or whose decoder is the shared trunk with nothing to compare (mtp,
nextlat's gpt variant: time a standard config), is a one-line error, exit status 2.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from nsl import hostmem
from nsl.errors import ArgumentParser, ConfigError, cli_main
from nsl import runs

VARIANTS = ("standard", "sps", "twox_memory", "delayed_state", "reverse_sps")


def _parse(argv):
  p = ArgumentParser(prog="python -m nsl.bench.decode", description=__doc__.split("\n")[0])
  p.add_argument("--config", required=True,
                 help="config file, or FILE.py:ARG (configs/sps.py:tiny); its model is decoded")
  p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variants timed side by side")
  p.add_argument("--prompt_len", type=int, default=448, help="prompt tokens (prefilled)")
  p.add_argument("--new_tokens", type=int, default=64, help="tokens decoded after the prompt")
  p.add_argument("--batch", type=int, default=1, help="sequences decoded at once")
  p.add_argument("--repeats", type=int, default=5, help="timed runs per variant (best and median reported)")
  p.add_argument("--layout", default=None, choices=("interleaved", "stream_major"),
                 help="prefill layout of the SPS variants (default: the config's, else nsl.models.sps.DEFAULT_LAYOUT)")
  p.add_argument("--workdir", default=None,
                 help="nextlat: a trained run (acceptance depends on the weights; prompts from its validation data)")
  p.add_argument("--draft_lens", default=None,
                 help="nextlat: comma-separated draft lengths to sweep, e.g. 2,4,6,8 (default: the config's draft_len)")
  p.add_argument("--temperature", type=float, default=0.0,
                 help="nextlat: sampling temperature (0: greedy, checked against plain greedy; > 0: Leviathan "
                      "acceptance, the output law the model's own)")
  p.add_argument("--window", type=int, default=None,
                 help="temporary-key window w for sps/delayed_state/reverse_sps (default: the config's, else 64)")
  from nsl.config import split_overrides

  overrides, rest = split_overrides(argv)
  args = p.parse_args(rest)
  args.variants = [v for v in args.variants.split(",") if v]
  for v in args.variants:
    if v not in VARIANTS:
      raise ConfigError(f"--variants: unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
  if args.temperature < 0:
    raise ConfigError(f"--temperature={args.temperature} must be >= 0 (0: greedy)")
  if min(args.prompt_len, args.new_tokens, args.batch, args.repeats) < 1:
    raise ConfigError("--prompt_len, --new_tokens, --batch and --repeats must be >= 1")
  if args.draft_lens is not None:
    try:
      args.draft_lens = [int(k) for k in args.draft_lens.split(",") if k.strip()]
    except ValueError:
      raise ConfigError(f"--draft_lens={args.draft_lens!r} must be comma-separated integers, e.g. 2,4,6,8") from None
    if not args.draft_lens or min(args.draft_lens) < 1:
      raise ConfigError("--draft_lens needs at least one draft length, each >= 1")
  return args, overrides


def prepare_variant(config, args) -> dict:
  """Builds, compiles and warms one variant; returns its timing closures and static figures."""
  import flax.linen as nn

  from nsl import decode
  from nsl.models import registry

  family = registry.get_family(config)
  dims, plan = family.dims, family.slot_plan()
  params = jax.jit(lambda r: nn.unbox(family.init(r)))(jax.random.PRNGKey(config.seed))
  prompt = jnp.asarray(np.random.default_rng(0).integers(1, dims.vocab_size, (args.batch, args.prompt_len)),
                       jnp.int32)
  total = args.prompt_len + args.new_tokens
  rng, start, greedy = jax.random.PRNGKey(0), jnp.int32(args.prompt_len), jnp.float32(0.0)

  # The first call, split: tracing + lowering + XLA compile of each program (the jit cache keeps
  # what `.lower().compile()` builds, so the calls after it do not compile again), then its run.
  t0 = time.perf_counter()
  decode.prefill_jit.lower(dims, plan, params, prompt, total).compile()
  t1 = time.perf_counter()
  logits, cache = jax.block_until_ready(decode.prefill_jit(dims, plan, params, prompt, total))
  t2 = time.perf_counter()
  compiled = decode.decode_loop.lower(dims, plan, params, cache, logits, args.new_tokens, greedy, start, rng).compile()
  t3 = time.perf_counter()
  jax.block_until_ready(decode.decode_loop(dims, plan, params, cache, logits, args.new_tokens, greedy, start, rng))
  first_call = time.perf_counter() - t0
  compile_s = {"prefill": round(t1 - t0, 3), "decode": round(t3 - t2, 3)}
  kv = decode.cache_bytes(cache)
  compiled = compiled.memory_analysis()
  rec = {
      "bench": "decode", "variant": config.model.variant, "host_huge_pages": hostmem.status(),
      "window": None if not plan.temporary_slots else plan.ring_size,
      "layout": plan.layout if plan.group > 1 else None,
      "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "batch": args.batch,
      "first_call_s": round(first_call, 3), "compile_s": compile_s | {"total": round(sum(compile_s.values()), 3)},
      "kv_cache_bytes": kv["total"], "kv_cache_detail": kv,
      "kv_cache_slots_per_row_layer": cache.size,
      "expected_kv_vs_standard": _expected_ratio(plan, total),
  }
  if compiled is not None:
    rec["decode_compiled_bytes"] = int(compiled.argument_size_in_bytes + compiled.output_size_in_bytes
                                       + compiled.temp_size_in_bytes - compiled.alias_size_in_bytes)
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    rec["peak_bytes"] = int(stats["peak_bytes_in_use"])  # process-wide, monotone over the run
  return {
      "rec": rec,
      "prefill": lambda: decode.prefill_jit(dims, plan, params, prompt, total),
      "decode": lambda: decode.decode_loop(dims, plan, params, cache, logits, args.new_tokens, greedy, start, rng),
      "times": {"prefill": [], "decode": []},
      "single_slot": plan.group == 1,  # one persistent slot per token: the standard model
  }


def _timed(fn) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def finish(entry, args) -> dict:
  rec, times = entry["rec"], entry["times"]
  for phase, tokens in (("prefill", args.prompt_len), ("decode", args.new_tokens)):
    best, med = min(times[phase]), statistics.median(times[phase])
    rec[f"{phase}_tokens_per_sec"] = args.batch * tokens / best
    rec[f"{phase}_tokens_per_sec_median"] = args.batch * tokens / med
    rec[f"{phase}_s"] = best
  return rec


def _expected_ratio(plan, total: int) -> float:
  """KV slots per row and layer over the standard model's T: a persistent slot per token for each
  persistent kind of the plan, the ring's w for each temporary one."""
  from nsl.nn import masks

  persistent = sum(k == masks.PERSISTENT for k in plan.kinds)
  return (persistent * total + (len(plan.kinds) - persistent) * plan.ring_size) / total


@cli_main
def main(argv=None) -> int:
  """What the config's family decoder offers decides the comparison (`nsl.models.decoder.Decoder`):
  a draft model, plain against self-speculative decoding; the family's own `bench`; else none."""
  args, overrides = _parse(sys.argv[1:] if argv is None else argv)
  from nsl import config as nsl_config
  from nsl.models import decoder as decoders, registry

  base = nsl_config.load_config(args.config, overrides)
  family = registry.get_family(base)
  decoder = decoders.require(family, "nsl.bench.decode")
  if decoder.speculative is not None:
    return _speculative(base, args, family)
  if decoder.bench is not None:  # "module:function" of the family's own comparison
    import importlib

    module, function = decoder.bench.split(":")
    return getattr(importlib.import_module(module), function)(base, args)
  raise ConfigError(f"nsl.bench.decode has no comparison for family {family.name!r} variant "
                    f"{base.model.variant!r}: plain against self-speculative decoding needs a dynamics model, which "
                    "it has not, and it decodes with the shared standard trunk (time a standard config of its sizes)")


def slot_variants(base, args) -> int:
  """The standard and SPS families' benchmark: the SPS variants of the config's model side by
  side (the module docstring), round-robin."""
  from nsl import config as nsl_config
  from nsl.models import sps

  setup = {"config": args.config, "platform": jax.default_backend(), "device": jax.devices()[0].device_kind,
           "jax": jax.__version__, "d_model": base.model.d_model, "n_layers": base.model.n_layers,
           "n_heads": base.model.n_heads, "vocab_size": base.model.vocab_size,
           "attention_impl_prefill": base.model.attention_impl, "repeats": args.repeats,
           "timing": "best (and median) of --repeats round-robin runs after a compile/warm-up call; "
                     "decode = one scan over the new tokens"}
  entries = {}
  for variant in args.variants:
    config = sps.variant_config(base, variant, args.window, args.layout)
    config.data.seq_len = max(config.data.seq_len, args.prompt_len + args.new_tokens)
    nsl_config.validate(config)
    entries[variant] = prepare_variant(config, args)
  for _ in range(args.repeats):  # round-robin, so load on a shared machine hits every variant alike
    for entry in entries.values():
      for phase in ("prefill", "decode"):
        entry["times"][phase].append(_timed(entry[phase]))
  _compare(entries, args, setup)
  return 0


def _compare(entries, args, setup) -> None:
  """Prints each variant's line, with its ratios to the standard model's (the variant of one slot
  per token) once that one is timed."""
  standard = reference = None
  for entry in entries.values():
    rec = finish(entry, args)
    if entry["single_slot"] and standard is None:
      standard, reference = rec, entry
    if standard is not None:
      rec["kv_cache_vs_standard"] = rec["kv_cache_bytes"] / standard["kv_cache_bytes"]
      rec["decode_speed_vs_standard"] = rec["decode_tokens_per_sec"] / standard["decode_tokens_per_sec"]
      # the same ratio round by round (the two runs of a round are adjacent, so they share the
      # machine's load): steadier on a shared host than the ratio of two best times
      rounds = [s / t for s, t in zip(reference["times"]["decode"], entry["times"]["decode"])]
      rec["decode_speed_vs_standard_by_round"] = [round(r, 4) for r in rounds]
      rec["decode_speed_vs_standard_median"] = statistics.median(rounds)
      rec["prefill_speed_vs_standard"] = rec["prefill_tokens_per_sec"] / standard["prefill_tokens_per_sec"]
    rec["setup"] = setup
    print(json.dumps(rec), flush=True)


def _speculative(base, args, family) -> int:
  """Plain vs self-speculative decoding (`speculative_sweep`) for each of `--draft_lens`."""
  import flax.linen as nn
  import numpy as np

  if args.workdir:
    from nsl.data import pipeline

    config, family, params = runs.load_run(args.workdir)
    batch = next(iter(pipeline.make_eval_batches(config.data.path, "val", seq_len=config.data.seq_len,
                                                 batch_size=args.batch, max_batches=1)))
    prompts = [np.asarray(row[:args.prompt_len], np.int32) for row in batch["tokens"]]
    weights = args.workdir
  else:
    params = None
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, base.model.vocab_size, args.prompt_len).astype(np.int32) for _ in range(args.batch)]
    weights = "random (pass --workdir=RUN for a trained model: acceptance depends on the weights)"
  if params is None:
    params = nn.unbox(jax.jit(family.init)(jax.random.PRNGKey(base.seed)))
  for row in speculative_sweep(family, params, prompts, args.new_tokens, args.draft_lens, args.temperature):
    row["setup"] = dict(row["setup"], weights=weights, config=args.config)
    print(json.dumps(row), flush=True)
  return 0


def speculative_sweep(family, params, prompts, new_tokens: int, draft_lens=None, temperature: float = 0.0):
  """JSON rows for each draft length k (None: the config's `draft_len`): `plain` and
  `speculative` (`nsl.speculative.measure`, side by side), then with several lengths one
  `sweep` row: tokens per draft, speed-up over plain decoding and greedy_match per k."""
  from nsl import speculative

  rows, sweep = [], []
  for k in draft_lens or [None]:
    result = speculative.measure(family, params, prompts, new_tokens, draft_len=k, temperature=temperature)
    for mode in ("plain", "speculative"):
      rows.append({"mode": mode, **result[mode], "setup": dict(result["setup"])})
    spec = result["speculative"]
    sweep.append({"draft_len": result["setup"]["draft_len"], "tokens_per_draft": spec["mean_tokens_per_draft"],
                  "speedup": spec["speedup"], "plain_tokens_per_s": result["plain"]["tokens_per_s"],
                  "speculative_tokens_per_s": spec["tokens_per_s"], "greedy_match": spec.get("greedy_match"),
                  "distinct_token_fraction": result["plain"]["distinct_token_fraction"]})
  if len(sweep) > 1:
    setup = {k: v for k, v in rows[0]["setup"].items() if k != "draft_len"}
    rows.append({"mode": "sweep", "draft_lens": [s["draft_len"] for s in sweep], "points": sweep,
                 "greedy_match": None if temperature else all(s["greedy_match"] for s in sweep), "setup": setup})
  return rows


if __name__ == "__main__":
  raise SystemExit(main())
