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

Other families: a `double_decoder` config is compared with decoder-only at matched size (KV-cache
bytes and decode tokens/s, `nsl.bench.dd_decode.compare`); a `nextlat` config compares plain and
self-speculative decoding (tokens/s, mean accepted tokens per draft; `--workdir=RUN` for a
trained model, whose validation rows give the prompts: for a planning task, `--prompt_len` = the
task's prompt length and `--new_tokens` = its answer length decode exactly the answers).
`--draft_lens=2,4,6,8` sweeps the draft length in one run (fixed draft lengths 2-10,
docs/papers/nextlat.md#speculative-decoding): per length a `plain` and a `speculative` line measured side by side (plain and
speculative alternating prompt by prompt), then one `sweep` line with the tokens per draft and
the speed-up against plain decoding for every length, and whether every greedy speculative
output equalled plain greedy decoding. `--temperature=T` samples instead (Leviathan acceptance;
greedy text of a small model loops, and loops draft easily: every line carries the plain
outputs' `distinct_token_fraction`). A `lift` config times LIFT's own-state feedback decode, its
variant and `lift_no_states` side by side (every prompt token is a sequential step there: the
state fed to a position comes from the previous position's logits). Every family's lines carry
`first_call_s`, the first prefill + decode with its compiles. Other configs (sed: no
left-to-right decoder; mtp and nextlat's gpt variant: the standard trunk, time a standard config)
are a one-line error, exit status 2.
"""

from __future__ import annotations

import copy
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


def variant_config(base, variant: str, window: int | None, layout: str | None = None):
  from nsl.models import sps

  c = copy.deepcopy(base)
  c.family = "sps"
  c.model.variant = variant
  if layout is not None:  # else the config's, or sps.DEFAULT_LAYOUT when it names none
    c.model.layout = layout
  if variant in ("standard", "twox_memory"):
    c.model.window = None
  else:
    c.model.window = window if window is not None else (base.model.window if base.model.window is not None else 64)
  return c


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
      "expected_kv_vs_standard": _expected_ratio(config.model.variant, total, plan.ring_size),
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


def _expected_ratio(variant: str, total: int, window: int) -> float:
  if variant == "standard":
    return 1.0
  if variant == "twox_memory":
    return 2.0
  return (total + window) / total


@cli_main
def main(argv=None) -> int:
  args, overrides = _parse(sys.argv[1:] if argv is None else argv)
  from nsl import config as nsl_config

  base = nsl_config.load_config(args.config, overrides)
  if base.family in OTHER_FAMILIES:
    return OTHER_FAMILIES[base.family](base, args)
  if base.family not in ("standard", "sps"):
    why = {"sed": "SED is a span-corruption encoder-decoder, with no left-to-right decoder",
           "mtp": "MTP decodes with the standard trunk: time a standard config of its sizes"}.get(base.family, "")
    raise ConfigError(f"nsl.bench.decode times standard / sps (the SPS variants side by side), double_decoder, "
                      f"nextlat and lift configs, not config.family={base.family!r}" + (f" ({why})" if why else ""))
  setup = {"config": args.config, "platform": jax.default_backend(), "device": jax.devices()[0].device_kind,
           "jax": jax.__version__, "d_model": base.model.d_model, "n_layers": base.model.n_layers,
           "n_heads": base.model.n_heads, "vocab_size": base.model.vocab_size,
           "attention_impl_prefill": base.model.attention_impl, "repeats": args.repeats,
           "timing": "best (and median) of --repeats round-robin runs after a compile/warm-up call; "
                     "decode = one scan over the new tokens"}
  entries = {}
  for variant in args.variants:
    config = variant_config(base, variant, args.window, args.layout)
    config.data.seq_len = max(config.data.seq_len, args.prompt_len + args.new_tokens)
    nsl_config.validate(config)
    entries[variant] = prepare_variant(config, args)
  for _ in range(args.repeats):  # round-robin, so load on a shared machine hits every variant alike
    for entry in entries.values():
      for phase in ("prefill", "decode"):
        entry["times"][phase].append(_timed(entry[phase]))
  standard = None
  for variant, entry in entries.items():
    rec = finish(entry, args)
    if variant == "standard":
      standard = rec
    if standard is not None:
      rec["kv_cache_vs_standard"] = rec["kv_cache_bytes"] / standard["kv_cache_bytes"]
      rec["decode_speed_vs_standard"] = rec["decode_tokens_per_sec"] / standard["decode_tokens_per_sec"]
      # the same ratio round by round (the two runs of a round are adjacent, so they share the
      # machine's load): steadier on a shared host than the ratio of two best times
      rounds = [s / t for s, t in zip(entries["standard"]["times"]["decode"], entry["times"]["decode"])]
      rec["decode_speed_vs_standard_by_round"] = [round(r, 4) for r in rounds]
      rec["decode_speed_vs_standard_median"] = statistics.median(rounds)
      rec["prefill_speed_vs_standard"] = rec["prefill_tokens_per_sec"] / standard["prefill_tokens_per_sec"]
    rec["setup"] = setup
    print(json.dumps(rec), flush=True)
  return 0


def _double_decoder(base, args) -> int:
  """Double decoder vs decoder-only at matched size (the same layers in one causal stack):
  KV-cache bytes and decode tokens/s side by side (`nsl.bench.dd_decode.compare`)."""
  from nsl import config as nsl_config
  from nsl.bench import dd_decode

  decoder_only = copy.deepcopy(base)
  decoder_only.family, decoder_only.model.variant = "standard", "standard"
  for c in (base, decoder_only):
    c.data.seq_len = max(c.data.seq_len, args.prompt_len + args.new_tokens)
    nsl_config.validate(c)
  rows = dd_decode.compare(base, decoder_only, batch=args.batch, prompt_len=args.prompt_len,
                           new_tokens=args.new_tokens, repeats=args.repeats)
  for row in rows:
    row["setup"] = {"config": args.config, "platform": jax.default_backend(), "batch": args.batch,
                    "prompt_len": args.prompt_len, "new_tokens": args.new_tokens}
    print(json.dumps(row), flush=True)
  return 0


def _nextlat(base, args) -> int:
  """Plain vs self-speculative decoding (`speculative_sweep`) for each of `--draft_lens`."""
  import flax.linen as nn
  import numpy as np

  from nsl.models import registry

  if args.workdir:
    from nsl.data import pipeline

    config, family, params = runs.load_run(args.workdir)
    batch = next(iter(pipeline.make_eval_batches(config.data.path, "val", seq_len=config.data.seq_len,
                                                 batch_size=args.batch, max_batches=1)))
    prompts = [np.asarray(row[:args.prompt_len], np.int32) for row in batch["tokens"]]
    weights = args.workdir
  else:
    family = registry.get_family(base)
    params = None
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, base.model.vocab_size, args.prompt_len).astype(np.int32) for _ in range(args.batch)]
    weights = "random (pass --workdir=RUN for a trained model: acceptance depends on the weights)"
  if not family.drafts_with_dynamics:
    raise ConfigError(f"nsl.bench.decode on a nextlat config compares plain and self-speculative decoding, which "
                      f"needs a dynamics model; variant {family.config.model.variant!r} has none (its trunk decodes "
                      "as a standard model: time a standard config of its sizes)")
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


def _lift(base, args) -> int:
  """LIFT's own-state feedback decode (`LiftFamily.generate`: the prompt's tokens fed one by one,
  each position fed the state of the previous one's logits, then the argmax tokens), for the
  config's variant and, side by side, `lift_no_states` (the same trunk fed b: what computing the
  states costs). The first call (`compile_s`: its tracing, lowering and XLA compile), then the
  best of `--repeats`."""
  import flax.linen as nn

  from nsl.models import lift, registry

  prompt = jnp.asarray(np.random.default_rng(0).integers(1, base.model.vocab_size, (args.batch, args.prompt_len)),
                       jnp.int32)
  positions = args.batch * (args.prompt_len + args.new_tokens)
  entries = []
  for variant in dict.fromkeys((base.model.variant, "lift_no_states")):
    config = copy.deepcopy(base)
    config.model.variant = variant
    config.data.seq_len = max(config.data.seq_len, args.prompt_len + args.new_tokens)
    family = registry.get_family(config)
    params = jax.jit(lambda r, f=family: nn.unbox(f.init(r)))(jax.random.PRNGKey(config.seed))
    run = lambda f=family, p=params: f.generate(p, prompt, args.new_tokens)
    t0 = time.perf_counter()
    lift._generate.lower(family.dims, family.spec, family.model, params, prompt, args.new_tokens,
                         family.decode_feed).compile()
    compile_s = time.perf_counter() - t0
    entries.append({"variant": variant, "run": run, "compile": compile_s, "first": compile_s + _timed(run),
                    "times": []})
  for _ in range(args.repeats):  # round-robin, so load drift hits both alike
    for e in entries:
      e["times"].append(_timed(e["run"]))
  for e in entries:
    best, med = min(e["times"]), statistics.median(e["times"])
    print(json.dumps({
        "bench": "decode", "family": "lift", "variant": e["variant"], "batch": args.batch,
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "first_call_s": round(e["first"], 3),
        "compile_s": round(e["compile"], 3),
        "seconds": best, "seconds_median": med, "positions_per_sec": positions / best,
        "new_tokens_per_sec": args.batch * args.new_tokens / best,
        "vs_lift_no_states": min(entries[-1]["times"]) / best,
        "setup": {"config": args.config, "platform": jax.default_backend(), "d_model": base.model.d_model,
                  "n_layers": base.model.n_layers, "vocab_size": base.model.vocab_size, "repeats": args.repeats,
                  "timing": "one compiled program per call; every prompt token is a sequential step "
                            "(own-state feedback)"},
    }), flush=True)
  return 0


OTHER_FAMILIES = {"double_decoder": _double_decoder, "nextlat": _nextlat, "lift": _lift}


if __name__ == "__main__":
  raise SystemExit(main())
