"""KV-cache generation for the standard transformer and every SPS variant (docs/papers/sps.md#kv-cache).

Tokens become *groups* of slots in logical order: one slot per token for `standard` (and the
standard trunk of nextlat / mtp), the pair (x_i, ρ_i) for the SPS variants, with per-slot `pos`
(causality), `tok` (RoPE position, window distance) and `kind`. Generation is prefill then one
group per new token, both through the model's own `layers.Stack` with a `kv_cache.KVCache`
(`trunk`; the same modules and parameter tree as training, scanned over the layers):

- **prefill** runs the prompt's slots in the family's physical layout through the training path
  (`nsl.nn.attention.attend`: the CPU kernel on CPU) and writes every layer's K/V;
- **extend** / **decode** feed new groups (one, or a self-speculative round's k+1): queries are
  their slots, keys the cache plus their own, visibility the family's `masks.Rule` on explicit
  per-slot fields (positions are dynamic here), in `KVCache.attend` (attend_dense's softmax with
  the cached and the new keys scored apart, over the cache's head-major layout). Only the
  read-out slot of each group reaches the head (one B x V product per decoded token).

The cache (nsl/nn/kv_cache.py) keeps persistent slots for every token and the temporary
slot of the last w tokens in a ring: per layer and row T slots for standard, T + w for sps /
delayed_state / reverse_sps, 2T for twox_memory. `sample` is the one sampler of every decoder.
Greedy (`temperature=0`) or temperature sampling; `truncate` adds top-k / top-p (nsl.generate).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from nsl.nn import attention, kv_cache, layers, masks

P, T_ = masks.PERSISTENT, masks.TEMPORARY


@dataclasses.dataclass(frozen=True)
class SlotPlan:
  """How a model lays a token out as slots, for generation: the family's `slot_plan()`."""

  kinds: tuple[int, ...]  # kind of each slot of a token's group (group order = logical order)
  readout: int  # which slot of the group yields the next-token logits
  rule: masks.Rule
  layout: str = "interleaved"  # physical order used by prefill ("stream_major" or "interleaved")
  # ρ [D] of group slot 1 = predict(params, predict_token_id) (SPS: `sps.predict_vector`, carried
  # here so this module needs no family's module); None: the group has no <predict> slot.
  predict: Callable[[Any, int | None], jax.Array] | None = None
  predict_token_id: int | None = None  # ρ = this row of the tied embedding; None = `predict_embedding`

  @property
  def has_predict(self) -> bool:
    return self.predict is not None

  @property
  def group(self) -> int:
    return len(self.kinds)

  @property
  def persistent_slots(self) -> tuple[int, ...]:
    return tuple(j for j, k in enumerate(self.kinds) if k == P)

  @property
  def temporary_slots(self) -> tuple[int, ...]:
    return tuple(j for j, k in enumerate(self.kinds) if k == T_)

  @property
  def ring_size(self) -> int:
    """Tokens kept in the temporary ring: the window w (0 when there are no temporary slots)."""
    if not self.temporary_slots:
      return 0
    if self.rule.window is None:
      raise ValueError("temporary slots with an unbounded window: use persistent slots instead")
    return int(self.rule.window)

  def prompt_layout(self, num_tokens: int) -> masks.Layout:
    """Static metadata of a prompt's slots in the physical prefill order (`masks.Layout.grouped`,
    the one definition of the SPS slot order)."""
    return masks.Layout.grouped(self.kinds, num_tokens, self.layout)


# ----------------------------------------------------------------------------- the trunk, by parts


def _embed(dims, params, plan: SlotPlan, tokens_BN):
  """Token groups [B, N, G, D] in logical order."""
  x = layers.Embedder(dims).apply({"params": params["embed"]}, tokens_BN, method="encode")
  if not plan.has_predict:
    return x[:, :, None]
  rho = jnp.broadcast_to(plan.predict(params, plan.predict_token_id).astype(x.dtype), x.shape)
  return jnp.stack([x, rho], axis=2)


def _norm(dims, p, x):
  return layers.RMSNorm(dims.norm_eps).apply({"params": p}, x)


def _head(dims, params, h_BSD):
  """Logits of final-normed hidden states (the tied head)."""
  return layers.Embedder(dims).apply({"params": params["embed"]}, h_BSD, method="decode")


def _logits(dims, params, h_BSD):
  """Logits of the last block's output (final norm, then the head)."""
  return _head(dims, params, layers.final_norm(dims).apply({"params": params["trunk"]["final_norm"]}, h_BSD))


def trunk(dims, rule: masks.Rule, params, x_BSD, cache: kv_cache.KVCache, step: kv_cache.Step, slots=None,
          with_residual: bool = False, outputs: tuple[int, ...] | None = None):
  """The shared trunk (`layers.Stack`, parameters `params['trunk']`) on the new slots `step`
  with the cache: -> (cache, final-normed hidden states [B, S, D]; with `with_residual` the pair
  (residual stream before the final norm, final-normed), for NextLat's `latent="residual"`). It
  runs scanned over the layers (one compiled layer body) whichever form the parameters are stored
  in, except on a `per_layer` cache: then unrolled, each layer reading its own weights and K/V
  buffers in place (`token_loop_params` makes the weights' form once, before the token loop).
  `outputs`: only these new slots' states are returned (`layers.Stack`)."""
  if cache.is_per_layer:
    d = dataclasses.replace(dims, scan_layers=False, remat="none")
    p = layers.unscanned_params(params["trunk"], dims.n_layers)
  else:
    d = dataclasses.replace(dims, scan_layers=True, remat="none")
    p = layers.scanned_params(params["trunk"], dims.n_layers)
  return layers.Stack(d, rule).apply({"params": p}, x_BSD, slots, cache=cache, step=step, with_residual=with_residual,
                                     outputs=outputs)


def token_loop_params(dims, params):
  """`params` with the trunk's layers as separate arrays (`layers.unscanned_params`), made once
  (inside jit: one copy) before a loop over tokens that runs on a `per_layer` cache, so each step
  reads every layer's weights in place rather than copying a slice of the stacked ones."""
  return {**params, "trunk": layers.unscanned_params(params["trunk"], dims.n_layers)}


# ----------------------------------------------------------------------------- cache


def init_cache(dims, plan: SlotPlan, batch: int, max_tokens: int) -> kv_cache.KVCache:
  """An empty cache for `max_tokens` tokens: persistent slots plus the ring of w tokens."""
  return kv_cache.KVCache.create(dims, batch, max_tokens, plan.kinds, plan.ring_size)


def cache_bytes(cache: kv_cache.KVCache) -> dict[str, int]:
  """Bytes of the arrays a cache allocates: K/V of the persistent part, of the ring, metadata."""
  return cache.nbytes()


# ----------------------------------------------------------------------------- prefill and decode


def prefill_hidden(dims, plan: SlotPlan, params, tokens_BN, max_tokens: int, with_residual: bool = False):
  """Runs the prompt [B, N] in the family's physical layout through the training path and
  returns (final hidden state of the last token's read-out slot [B, D], cache); `with_residual`:
  the state is the pair (residual before the final norm, final-normed), as `trunk`'s."""
  b, n = tokens_BN.shape
  lay = plan.prompt_layout(n)
  g = plan.group
  x = _embed(dims, params, plan, tokens_BN).reshape(b, n * g, dims.d_model)[:, lay.pos]  # physical order
  seg = jnp.ones((b, lay.num_slots), jnp.int32)
  cache = init_cache(dims, plan, b, max_tokens)
  step = cache.step(lay.pos, lay.tok, lay.kind, seg, prefill=True)
  cache, h = trunk(dims, plan.rule, params, x, cache, step, attention.Slots(lay, segment=seg), with_residual)
  last = int(np.argsort(lay.pos)[(n - 1) * g + plan.readout])  # physical index of that slot
  return jax.tree.map(lambda a: a[:, last], h), cache


def prefill(dims, plan: SlotPlan, params, tokens_BN, max_tokens: int):
  """Runs the prompt [B, N] and returns (read-out logits of the last token [B, V], cache)."""
  h, cache = prefill_hidden(dims, plan, params, tokens_BN, max_tokens)
  return _head(dims, params, h[:, None])[:, 0], cache


def extend(dims, plan: SlotPlan, params, cache, tokens_BM, start, with_residual: bool = False, rope=None):
  """Feeds tokens [B, M] at token positions start..start+M-1 (`start` may be traced) after the
  cached ones: -> (final hidden states of their read-out slots [B, M, D], updated cache). Cache
  entries of tokens >= start (a rejected draft) are ignored and overwritten. `with_residual`:
  the states are pairs (residual before the final norm, final-normed), as `trunk`'s. `rope`:
  (sin, cos) [M, head_dim/2] of the tokens' RoPE angles, from a table a token loop made once."""
  b, m = tokens_BM.shape
  g = plan.group
  tok = jnp.repeat(jnp.asarray(start, jnp.int32) + jnp.arange(m, dtype=jnp.int32), g)
  pos = tok * g + jnp.tile(jnp.arange(g, dtype=jnp.int32), m)
  kind = jnp.tile(jnp.asarray(plan.kinds, jnp.int32), m)
  x = _embed(dims, params, plan, tokens_BM).reshape(b, m * g, dims.d_model)  # logical order
  step = cache.step(pos, tok, kind, jnp.ones((b, m * g), jnp.int32))
  if rope is not None:  # a token's slots share its position
    step = step.replace(rope=tuple(jnp.repeat(t, g, axis=0) for t in rope))
  readout = None if g == 1 else tuple(t * g + plan.readout for t in range(m))  # only these reach the head
  cache, h = trunk(dims, plan.rule, params, x, cache, step, with_residual=with_residual, outputs=readout)
  return h, cache


def decode_step(dims, plan: SlotPlan, params, cache, token_B, index, rope=None):
  """Feeds token `index` (a traced int32 scalar, the token's position) and returns
  (its read-out logits [B, V], the updated cache). `rope`: its (sin, cos) [1, head_dim/2]."""
  h, cache = extend(dims, plan, params, cache, token_B[:, None], index, rope=rope)
  return _head(dims, params, h)[:, 0], cache


# ----------------------------------------------------------------------------- generation


ARGMAX_CHUNK = 64


def argmax(logits_BV):
  """`jnp.argmax` over the last axis (the first index of the maximum, or of the first NaN), in two
  levels: the max of each 64-wide chunk (NaN counted as +inf: XLA:CPU's max does not keep NaN),
  the first chunk holding the row's maximum, and `jnp.argmax` inside it. The same index as
  `jnp.argmax` except in a row holding +inf in an earlier chunk than its first NaN (there: the
  +inf's). Every greedy choice of a token uses it (`sample`, the speculative rounds' acceptance,
  LIFT's greedy loop), so they agree. Why: XLA:CPU's (value, index) reduce of `jnp.argmax` took 0.7 ms of an XS decode step
  for [8, 50,304] logits (3% of the step); the chunked form is a max reduction and one 64-wide
  argmax per row (~0.1 ms). -> int32 [...]."""
  c = ARGMAX_CHUNK
  pad = (-logits_BV.shape[-1]) % c
  # -inf padding is never before a real entry's maximum (first occurrence), and wins only a row of -inf, at 0
  padded = jnp.pad(logits_BV, [(0, 0)] * (logits_BV.ndim - 1) + [(0, pad)], constant_values=-jnp.inf) if pad else logits_BV
  chunks = padded.reshape(padded.shape[:-1] + (-1, c))
  j = jnp.argmax(jnp.max(jnp.where(jnp.isnan(chunks), jnp.inf, chunks), axis=-1), axis=-1)
  inside = jnp.take_along_axis(chunks, j[..., None, None], axis=-2)[..., 0, :]
  return (j * c + jnp.argmax(inside, axis=-1)).astype(jnp.int32)


def sample(logits_BV, rng, temperature):
  """Greedy where `temperature` is 0, else a draw from softmax(logits / temperature).
  `temperature` may be traced (one compiled program serves both); a `lax.cond` runs only the
  branch it needs, so greedy decoding makes no Gumbel noise (B·V random draws per token, ~15% of
  an XS decode step on CPU when both branches ran)."""
  t = jnp.asarray(temperature, jnp.float32)
  greedy = argmax
  drawn = lambda lg: jax.random.categorical(rng, lg / jnp.where(t > 0, t, 1.0), axis=-1).astype(jnp.int32)
  return jax.lax.cond(t > 0, drawn, greedy, logits_BV)


def truncate(logits_BV, top_k: int = 0, top_p: float = 1.0):
  """Top-k, then top-p (nucleus) truncation of (temperature-scaled) logits [..., V]: entries
  outside the `top_k` largest, then outside the smallest set of largest whose probability
  reaches `top_p`, become -inf (the token that crosses `top_p` stays, so at least one does).
  `top_k` 0 and `top_p` 1 leave the logits as they are; draw with `sample` at temperature 1. Ties
  at the k-th value all stay."""
  if top_k and top_k < logits_BV.shape[-1]:
    kth = jax.lax.top_k(logits_BV, top_k)[0][..., -1:]
    logits_BV = jnp.where(logits_BV < kth, -jnp.inf, logits_BV)
  if top_p < 1.0:
    order = jnp.sort(logits_BV, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(order, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the strictly larger entries
    cut = jnp.min(jnp.where(before < top_p, order, jnp.inf), axis=-1, keepdims=True)
    logits_BV = jnp.where(logits_BV < cut, -jnp.inf, logits_BV)
  return logits_BV


@functools.partial(jax.jit, static_argnums=(0, 1, 4))
def prefill_jit(dims, plan, params, prompt_BN, max_tokens: int):
  """Jitted `prefill`."""
  return prefill(dims, plan, params, prompt_BN, max_tokens)


@functools.partial(jax.jit, static_argnums=(0, 1, 5))
def decode_loop(dims, plan, params, cache, logits_BV, steps: int, temperature, start, rng):
  """Samples `steps` tokens starting from the prefill's logits: token k is drawn from logits k
  and (except the last) fed back at position `start + k`. Returns (tokens [B, steps],
  logits [B, steps, V], final cache in its per-layer form: `.stacked()` restacks it, a copy of
  the whole cache that no decoder here needs). The token loop is a `lax.scan` (one compiled step)
  whose step runs the layers unrolled on per-layer weights and K/V (`KVCache.per_layer`: an XS
  step on 2 cores 1.6-1.8x faster than reading slices of stacked arrays in a layer scan)."""
  params = token_loop_params(dims, params)
  table = rope_rows(dims, start, steps)
  step = lambda cache, token, index: decode_step(dims, plan, params, cache, token, index,
                                                 rope=table(index - start))
  return sample_loop(step, cache.per_layer(), logits_BV, steps, temperature, start, rng)


def rope_rows(dims, start, steps: int):
  """RoPE's (sin, cos) for token positions start..start+steps-1, made once before a token loop:
  -> k ↦ row k's pair, each [1, head_dim/2] (`extend`'s `rope`). Inside the loop XLA evaluated
  sin and cos per element of every layer's q and k (0.4 ms of a standard XS decode step, 0.8 ms
  of an SPS one)."""
  sin, cos = layers.rope_table(jnp.asarray(start, jnp.int32) + jnp.arange(steps, dtype=jnp.int32), dims.head_dim,
                               dims.rope_theta)
  return lambda k: tuple(jax.lax.dynamic_slice_in_dim(t, k, 1) for t in (sin, cos))


def sample_loop(step, state, logits_BV, steps: int, temperature, start, rng):
  """The token loop of the KV-cache decoders (`decode_loop`, `dd_decode.decode_loop`): token k is
  drawn from logits k (`sample`) and, except the last, fed back at position `start + k` through
  `step(state, token_B, index) -> (logits [B, V], state)`, one compiled `lax.scan` step.
  Returns (tokens [B, steps], logits [B, steps, V], final state). The logits are a loop carry in their returned layout, written in
  place per step: as the scan's stacked output [steps - 1, B, V] they were copied once more after
  the loop, transposed (206 MB at XS and 128 tokens: ~1 ms a token)."""
  rngs = jax.random.split(rng, steps)
  first = sample(logits_BV, rngs[0], temperature)
  all_logits = jnp.zeros((logits_BV.shape[0], steps, logits_BV.shape[-1]), logits_BV.dtype).at[:, 0].set(logits_BV)

  def body(carry, xs):
    state, token, all_logits = carry
    k, key = xs
    logits, state = step(state, token, start + k)
    nxt = sample(logits, key, temperature)
    return (state, nxt, jax.lax.dynamic_update_index_in_dim(all_logits, logits, k + 1, axis=1)), nxt

  (state, _, all_logits), toks = jax.lax.scan(body, (state, first, all_logits),
                                              (jnp.arange(steps - 1, dtype=jnp.int32), rngs[1:]))
  return jnp.concatenate([first[:, None], toks.T], axis=1), all_logits, state


def generate(family, params, prompt_BN, new_tokens: int, *, temperature: float = 0.0, rng=None):
  """Generates `new_tokens` after `prompt_BN` [B, N] with the KV cache.

  Returns (tokens [B, new_tokens] int32, logits [B, new_tokens, V] float32), where logits[:, k]
  is the distribution token k was drawn from (greedy when `temperature == 0`).
  """
  if new_tokens < 1:
    raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
  rng = jax.random.PRNGKey(0) if rng is None else rng
  prompt = jnp.asarray(prompt_BN, jnp.int32)
  n = prompt.shape[1]
  dims, plan = family.dims, family.slot_plan()
  logits, cache = prefill_jit(dims, plan, params, prompt, n + new_tokens)
  tokens, all_logits, _ = decode_loop(dims, plan, params, cache, logits, int(new_tokens),
                                      jnp.float32(temperature), jnp.int32(n), rng)
  return tokens, all_logits


def generate_uncached(family, params, prompt_BN, new_tokens: int, *, temperature: float = 0.0, rng=None):
  """The reference: run `family.model` over the whole sequence at every step (one document).

  The sequence is kept in a fixed buffer of prompt + new tokens; the model is causal, so the
  not-yet-generated tail does not affect the logits read at the last real token.
  """
  rng = jax.random.PRNGKey(0) if rng is None else rng
  rngs = jax.random.split(rng, new_tokens)
  prompt = jnp.asarray(prompt_BN, jnp.int32)
  b, n = prompt.shape
  seq = jnp.zeros((b, n + new_tokens), jnp.int32).at[:, :n].set(prompt)

  @jax.jit
  def step(seq, length, key):
    logits = family.model.apply({"params": params}, seq, jnp.ones_like(seq))
    lg = jax.lax.dynamic_index_in_dim(logits, length - 1, axis=1, keepdims=False)
    nxt = sample(lg, key, temperature)
    return jax.lax.dynamic_update_slice_in_dim(seq, nxt[:, None], length, axis=1), nxt, lg

  toks, logits = [], []
  for k in range(new_tokens):
    seq, nxt, lg = step(seq, jnp.int32(n + k), rngs[k])
    toks.append(nxt)
    logits.append(lg)
  return jnp.stack(toks, axis=1), jnp.stack(logits, axis=1)
