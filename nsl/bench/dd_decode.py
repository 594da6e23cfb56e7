"""KV-cache bytes and decode speed, double decoder vs a decoder-only model of matched size
(docs/papers/double_decoder.md#generation: the cache holds Lg of L layers per context token). Called by
`python -m nsl.bench.decode --config=configs/dd.py`."""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from nsl import decode
from nsl.models.dd_decode import cache_bytes, decode_loop, prefill

def _time(fn, repeats: int) -> float:
  """Best of `repeats` calls of an already compiled `fn`."""
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best


def compare(dd_config, decoder_only_config, *, batch: int = 4, prompt_len: int = 256, new_tokens: int = 64,
            repeats: int = 3, seed: int = 0) -> list[dict]:
  """KV-cache bytes and decode tokens/s, double decoder vs decoder-only (random weights; the
  figures depend on shapes only), measured side by side, and each model's first call (prefill +
  decode, compiles included). One dict per model plus a ratio row."""
  from nsl.models import registry

  rng = np.random.default_rng(seed)
  rows = []
  for name, config in (("double_decoder", dd_config), ("decoder_only", decoder_only_config)):
    family = registry.get_family(config)
    params = nn.unbox(family.init(jax.random.PRNGKey(seed)))
    prompt = jnp.asarray(rng.integers(1, min(config.model.vocab_size, 50000), (batch, prompt_len)), jnp.int32)
    key = jax.random.PRNGKey(seed)
    t0 = time.perf_counter()  # the first call: prefill + decode, compiles included
    if name == "double_decoder":
      logits, cache = prefill(family.model, params, prompt, new_tokens)
      jax.block_until_ready(decode_loop(family.model, params, cache, logits, new_tokens, 0.0, key))
      first_call = time.perf_counter() - t0
      t_prefill = _time(lambda: prefill(family.model, params, prompt, new_tokens), repeats)
      t_decode = _time(lambda: decode_loop(family.model, params, cache, logits, new_tokens, 0.0, key), repeats)
      nbytes = cache_bytes(cache)
      kv, slots = nbytes["total"], (prompt_len - 1) + new_tokens
      layers_cached = family.model.gen_layers
    else:
      dims, plan = family.dims, family.slot_plan()
      total = prompt_len + new_tokens
      logits, cache = decode.prefill_jit(dims, plan, params, prompt, total)
      jax.block_until_ready(decode.decode_loop(dims, plan, params, cache, logits, new_tokens, 0.0,
                                               jnp.int32(prompt_len), key))
      first_call = time.perf_counter() - t0
      t_prefill = _time(lambda: decode.prefill_jit(dims, plan, params, prompt, total), repeats)
      t_decode = _time(lambda: decode.decode_loop(dims, plan, params, cache, logits, new_tokens, 0.0,
                                                     jnp.int32(prompt_len), key), repeats)
      nbytes = decode.cache_bytes(cache)
      kv, slots = nbytes["persistent"] + nbytes["ring"], total
      layers_cached = dims.n_layers
    counts = family.param_counts()
    rows.append({"model": name, "params_total": counts["params_total"], "layers_cached": int(layers_cached),
                 "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens,
                 "kv_cache_bytes": int(kv), "kv_bytes_per_token": kv / (batch * slots),
                 "first_call_s": first_call, "prefill_s": t_prefill, "decode_s": t_decode,
                 "decode_tokens_per_s": batch * new_tokens / t_decode, "backend": jax.default_backend()})
  dd, do = rows
  rows.append({"model": "ratio_dd_over_decoder_only",
               "kv_bytes_per_token": dd["kv_bytes_per_token"] / do["kv_bytes_per_token"],
               "decode_tokens_per_s": dd["decode_tokens_per_s"] / do["decode_tokens_per_s"],
               "prefill_s": dd["prefill_s"] / do["prefill_s"]})
  return rows


def bench(base, args) -> int:
  """Double decoder vs decoder-only at matched size (the same layers in one causal stack):
  KV-cache bytes and decode tokens/s side by side (`compare`); the double
  decoder's `Decoder.bench`, run by `python -m nsl.bench.decode`.."""
  import copy
  import json

  from nsl import config as nsl_config

  decoder_only = copy.deepcopy(base)
  decoder_only.family, decoder_only.model.variant = "standard", "standard"
  for c in (base, decoder_only):
    c.data.seq_len = max(c.data.seq_len, args.prompt_len + args.new_tokens)
    nsl_config.validate(c)
  rows = compare(base, decoder_only, batch=args.batch, prompt_len=args.prompt_len,
                           new_tokens=args.new_tokens, repeats=args.repeats)
  for row in rows:
    row["setup"] = {"config": args.config, "platform": jax.default_backend(), "batch": args.batch,
                    "prompt_len": args.prompt_len, "new_tokens": args.new_tokens}
    print(json.dumps(row), flush=True)
  return 0
