"""Cached generation for the double decoder (docs/papers/double_decoder.md#generation); its KV-cache /
decode-speed comparison with a decoder-only model is `nsl.bench.dd_decode`.

Generation treats the prompt as context and the generated tokens as one new block that starts
at the *last prompt token* (position P-1): that token's generation-decoder output predicts the
first new token, as in training, where the last position of a block predicts the next block's
first token from inside its own block. With `block_size`, every `block_size` tokens close a block:
the context decoder re-prefills the grown prompt and the next block starts at its last token.

- **prefill**: the context decoder runs once over prompt[:P-1] (the earlier blocks); each
  generation layer projects the latents to its cross K/V, which are cached ([Lg, B, P-1, H, Dh]);
  the context decoder's own K/V are not kept. Then the last prompt token is decoded. A prompt of
  one token has no context: the block starts at token 0, whose latent is still the cross
  attention's sink (CROSS_RULE), as in the training forward with no block 0 (lm-eval's empty
  `generate_until` context is one EOS token).
- **decode**: one token at a time through the generation decoder only: self K/V of the current
  block in the shared `kv_cache.KVCache` (`new_tokens` slots, visibility from SELF_RULE), cross
  attention to the cached context K/V, merged by LSE.
Per token of context the cache holds Lg layers of K and V (vs all L layers for decoder-only):
a third of decoder-only's with the 2:1 split.

`generate_uncached` is the reference: full recomputation with `DoubleDecoder.__call__` and block
ids [0]*(P-1) + [1]*rest at every step. Tokens are drawn by `nsl.decode.sample`, the sampler of
every decoder.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from nsl import decode
from nsl.nn import kv_cache

@functools.partial(jax.jit, static_argnums=(0, 3))
def prefill(model: nn.Module, params, prompt_BP, new_tokens: int):
  """(logits of the first new token [B, V], cache) for a prompt of P >= 1 tokens."""
  b, p = prompt_BP.shape
  ctx = prompt_BP[:, :max(p - 1, 1)]  # P = 1: token 0 only as the sink (block 1, not earlier)
  cross_k, cross_v = model.apply({"params": params}, ctx, jnp.ones_like(ctx), method="cross_cache")
  cross_k, cross_v = jax.vmap(kv_cache.head_major)(cross_k, cross_v)  # [Lg, B, H, Dh, Nc], [Lg, B, H, Nc, Dh]
  self_cache = kv_cache.KVCache.create(dataclasses.replace(model.dims, n_layers=model.gen_layers), b, new_tokens)
  start = jnp.int32(p - 1)
  logits, self_cache = model.apply({"params": params}, prompt_BP[:, p - 1], start, cross_k, cross_v, start,
                                   self_cache, start, method="gen_step")
  return logits, {"cross_k": cross_k, "cross_v": cross_v, "self": self_cache, "start": start}


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def decode_loop(model: nn.Module, params, cache, logits_BV, steps: int, temperature: float, rng):
  """Samples `steps` tokens from the prefill's logits onwards; returns (tokens, logits, cache), the
  self cache in its per-layer form (`nsl.decode.decode_loop`'s).
  The token loop reads each generation layer's cross and self K/V as separate buffers (split once
  before the loop, as `nsl.decode.decode_loop` does: XLA:CPU copies a slice of a stacked array
  before every matmul that reads it)."""
  split = lambda a: tuple(a[i] for i in range(a.shape[0]))
  cross_k, cross_v = split(cache["cross_k"]), split(cache["cross_v"])

  def step(self_cache, token, index):  # context keys: positions < start (P - 1; the sink alone when 0)
    return model.apply({"params": params}, token, index, cross_k, cross_v, cache["start"], self_cache,
                       cache["start"], method="gen_step")

  tokens, logits, self_cache = decode.sample_loop(step, cache["self"].per_layer(), logits_BV, steps, temperature,
                                                  cache["start"] + 1, rng)
  return tokens, logits, dict(cache, self=self_cache)


def generate(family, params, prompt_BP, new_tokens: int, *, temperature: float = 0.0, rng=None,
             block_size: int | None = None):
  """`new_tokens` tokens after the prompt [B, P] with the cache: (tokens [B, N], logits [B, N, V]).

  `block_size` (default: all in one block) closes a block every `block_size` tokens: the context
  decoder then re-prefills the grown prompt and a new block starts at its last token."""
  if new_tokens < 1 or prompt_BP.shape[1] < 1:
    raise ValueError("need new_tokens >= 1 and a prompt of at least 1 token")
  rng = jax.random.PRNGKey(0) if rng is None else rng
  seq = jnp.asarray(prompt_BP, jnp.int32)
  size = int(block_size or new_tokens)
  toks, logits, done = [], [], 0
  while done < new_tokens:
    n = min(size, new_tokens - done)
    first_logits, cache = prefill(family.model, params, seq, n)
    t, lg, _ = decode_loop(family.model, params, cache, first_logits, n, float(temperature),
                           jax.random.fold_in(rng, done))
    toks.append(t)
    logits.append(lg)
    seq = jnp.concatenate([seq, t], axis=1)
    done += n
  return jnp.concatenate(toks, axis=1), jnp.concatenate(logits, axis=1)


def generate_uncached(family, params, prompt_BP, new_tokens: int, *, temperature: float = 0.0, rng=None,
                      block_size: int | None = None):
  """Reference: recompute the whole sequence at every step (the training forward) with block ids
  0 for the context and 1, 2, ... for each `block_size` tokens from the last prompt token on."""
  rng = jax.random.PRNGKey(0) if rng is None else rng
  prompt = jnp.asarray(prompt_BP, jnp.int32)
  b, p = prompt.shape
  size = int(block_size or new_tokens)
  keys = [jax.random.split(jax.random.fold_in(rng, d), min(size, new_tokens - d)) for d in range(0, new_tokens, size)]
  rngs = jnp.concatenate(keys)
  # One fixed-length buffer (one compile): positions after the current one are causally invisible.
  seq = jnp.concatenate([prompt, jnp.zeros((b, new_tokens), jnp.int32)], axis=1)
  pos = jnp.arange(p + new_tokens)
  block = jnp.where(pos >= p - 1, (pos - (p - 1)) // size + 1, 0).astype(jnp.int32)[None]
  apply = jax.jit(lambda prm, t: family.model.apply({"params": prm}, t, jnp.ones_like(t), block))
  toks, logits = [], []
  for k in range(new_tokens):
    lg = apply(params, seq)[:, p - 1 + k]
    nxt = decode.sample(lg, rngs[k], temperature)
    toks.append(nxt)
    logits.append(lg)
    seq = seq.at[:, p + k].set(nxt)
  return jnp.stack(toks, axis=1), jnp.stack(logits, axis=1)


def decoder(family):
  """The double decoder's `nsl.models.decoder.Decoder`: `generate` above, prefill and a jitted
  generation-decoder step a token at a time (its self cache per layer, donated), and its own
  benchmark beside a decoder-only model (`nsl.bench.dd_decode.bench`)."""
  from nsl.models.decoder import Decoder

  model = family.model

  def gen_step(params, cache, self_cache, tok, index):
    split = lambda a: tuple(a[i] for i in range(a.shape[0]))
    return model.apply({"params": params}, tok, index, split(cache["cross_k"]), split(cache["cross_v"]),
                       cache["start"], self_cache, cache["start"], method="gen_step")

  jit_step = jax.jit(gen_step, donate_argnums=2)

  def first(params, prompt_BP, new_tokens: int):
    logits, cache = prefill(model, params, jnp.asarray(prompt_BP, jnp.int32), new_tokens)
    return logits, (cache, cache["self"].per_layer())

  def step(params, state, token_B, k: int):
    cache, self_cache = state
    logits, self_cache = jit_step(params, cache, self_cache, token_B, cache["start"] + 1 + k)
    return logits, (cache, self_cache)

  return Decoder(generate=functools.partial(generate, family), prefill=first, step=step,
                 bench="nsl.bench.dd_decode:bench")


def cache_bytes(cache: dict[str, Any]) -> dict[str, int]:
  nb = lambda names: int(sum(cache[n].size * cache[n].dtype.itemsize for n in names))
  out = {"cross": nb(("cross_k", "cross_v")), "self": cache["self"].nbytes()["persistent"]}  # K/V only
  out["total"] = out["cross"] + out["self"]
  return out
