"""LIFT's own-state feedback decode timed beside its trunk without states: LIFT's `Decoder.bench`,
run by `python -m nsl.bench.decode --config=configs/lift.py:lift_tiny` (docs/papers/lift.md)."""

from __future__ import annotations

import copy
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from nsl.bench.decode import _timed


def bench(base, args) -> int:
  """LIFT's own-state feedback decode (its `Decoder.generate`: the prompt's tokens fed one by one,
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
    run = lambda f=family, p=params: f.decoder().generate(p, prompt, args.new_tokens)
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
