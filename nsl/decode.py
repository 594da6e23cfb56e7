"""KV-cache generation for the standard transformer and every SPS variant (REFERENCES §1).

Tokens become *groups* of slots in logical order: one slot per token for `standard`, the pair
(x_i, ρ_i) for the SPS variants, with per-slot `pos` (causality), `tok` (RoPE position, window
distance) and `kind`. Generation is prefill then one group per new token:

- **prefill** runs the prompt's slots through the trunk in the family's physical layout with
  `nsl.attention.attend` (the training path, chunked on CPU) and keeps every layer's K/V;
- **decode** feeds the sampled token's group: queries are the group's slots, keys are the
  persistent cache, the temporary ring and the group itself, visibility is the family's
  `masks.Rule` evaluated by `attention.attend_dense` on explicit per-slot fields (positions are
  dynamic here), and the group's K/V are then written to the caches.

Caches, per layer: a **persistent** cache that grows by the persistent slots of each token
(preallocated to the final length; entries beyond the current length are masked out), and a
**temporary ring** of `w` tokens, entry `tok mod w`: a query at token t sees temporary keys of
tokens t-w..t, of which t itself is in the group being decoded, so w past tokens suffice and
older ones are overwritten (evicted). Per layer and row that is T slots for standard, T + w for
sps / delayed_state / reverse_sps, 2T for twox_memory.

Decoding reuses the trained parameter tree and the layers' own modules (`Embedder.encode` /
`decode`, `RMSNorm`, `Attention.project_q` / `project_kv` / `output`, `SwiGLU`) bound to the
sub-trees of `params`, so it runs the same parameters through the same code as `model.apply`.
Greedy (`temperature=0`) or temperature sampling.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from nsl import attention, masks
from nsl.models import layers

P, T_ = masks.PERSISTENT, masks.TEMPORARY


@dataclasses.dataclass(frozen=True)
class SlotPlan:
  """How a model lays a token out as slots, for generation."""

  kinds: tuple[int, ...]  # kind of each slot of a token's group (group order = logical order)
  readout: int  # which slot of the group yields the next-token logits
  rule: masks.Rule
  layout: str = "interleaved"  # physical order used by prefill ("stream_major" or "interleaved")
  has_predict: bool = False  # group slot 1 is the learned <predict> embedding
  predict_token_id: int | None = None  # ρ = this row of the tied embedding; None = `predict_embedding`

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
    """Static metadata of a prompt's slots in the physical prefill order."""
    g = self.group
    pos = np.arange(g * num_tokens, dtype=np.int32)
    if self.layout == "stream_major" and g > 1:
      pos = np.concatenate([pos[j::g] for j in range(g)])
    return masks.Layout(pos=pos, tok=pos // g, kind=np.asarray(self.kinds, np.int32)[pos % g])


def plan_for(family) -> SlotPlan:
  """The SlotPlan of a Family object (`standard` family or `sps` family, any variant)."""
  from nsl.models import sps

  if family.name == "sps" and family.variant != "standard":
    spec = sps.SPECS[family.variant]
    return SlotPlan(kinds=spec.kinds, readout=spec.readout, rule=family.rule, layout=family.layout_name,
                    has_predict=True, predict_token_id=family.predict_token_id)
  if family.name in ("sps", "standard"):
    return SlotPlan(kinds=(P,), readout=0, rule=family.rule)
  raise ValueError(f"no KV-cache decoder for family {family.name!r}")


# ----------------------------------------------------------------------------- the trunk, by parts


def _embed(dims, params, plan: SlotPlan, tokens_BN):
  """Token groups [B, N, G, D] in logical order."""
  x = layers.Embedder(dims).apply({"params": params["embed"]}, tokens_BN, method="encode")
  if not plan.has_predict:
    return x[:, :, None]
  from nsl.models import sps

  rho = jnp.broadcast_to(sps.predict_vector(params, plan.predict_token_id).astype(x.dtype), x.shape)
  return jnp.stack([x, rho], axis=2)


def _norm(dims, p, x):
  return layers.RMSNorm(dims.norm_eps).apply({"params": p}, x)


def _attn(dims, p):
  return layers.Attention(dims).bind({"params": p})


def _mlp(dims, p, x):
  return layers.SwiGLU(dims).apply({"params": p}, x)


def _logits(dims, params, h_BSD):
  h = _norm(dims, params["trunk"]["final_norm"], h_BSD)
  return layers.Embedder(dims).apply({"params": params["embed"]}, h, method="decode")


# ----------------------------------------------------------------------------- cache


def init_cache(dims, plan: SlotPlan, batch: int, max_tokens: int) -> dict[str, Any]:
  """Empty caches for `max_tokens` tokens: persistent [L, B, P, H, Dh] and ring [L, B, R, H, Dh]."""
  npers = len(plan.persistent_slots) * max_tokens
  ring = plan.ring_size
  dt = dims.compute_dtype
  shape = lambda n: (dims.n_layers, batch, n, dims.n_heads, dims.head_dim)
  return {
      "k": jnp.zeros(shape(npers), dt), "v": jnp.zeros(shape(npers), dt),
      "p_pos": jnp.zeros((npers,), jnp.int32), "p_tok": jnp.zeros((npers,), jnp.int32),
      "p_valid": jnp.zeros((npers,), jnp.int32),
      "rk": jnp.zeros(shape(ring), dt), "rv": jnp.zeros(shape(ring), dt),
      "r_pos": jnp.zeros((ring,), jnp.int32), "r_tok": jnp.zeros((ring,), jnp.int32),
      "r_valid": jnp.zeros((ring,), jnp.int32),
  }


def cache_bytes(cache: dict[str, Any]) -> dict[str, int]:
  """Bytes of the arrays a cache allocates: K/V of the persistent cache, of the ring, metadata."""
  nb = lambda names: int(sum(cache[n].size * cache[n].dtype.itemsize for n in names))
  out = {"persistent": nb(("k", "v")), "ring": nb(("rk", "rv")),
         "metadata": nb(("p_pos", "p_tok", "p_valid", "r_pos", "r_tok", "r_valid"))}
  out["total"] = sum(out.values())
  return out


# ----------------------------------------------------------------------------- prefill


def prefill(dims, plan: SlotPlan, params, tokens_BN, max_tokens: int):
  """Runs the prompt [B, N] and returns (read-out logits of the last token [B, V], cache)."""
  b, n = tokens_BN.shape
  lay = plan.prompt_layout(n)
  g = plan.group
  x = _embed(dims, params, plan, tokens_BN).reshape(b, n * g, dims.d_model)[:, lay.pos]  # physical order
  slots = attention.Slots(lay, segment=jnp.ones((b, lay.num_slots), jnp.int32))
  ks, vs = [], []
  for i in range(dims.n_layers):
    p = layers.layer_params(params["trunk"], i)
    attn = _attn(dims, p["attn"])
    h = _norm(dims, p["attn_norm"], x)
    q = attn.project_q(h, lay.tok)
    k, v = attn.project_kv(h, lay.tok)
    o = attention.attend(q, k, v, plan.rule, slots, slots, impl=dims.attention_impl,
                         chunk_q=dims.attention_chunk, chunk_k=dims.attention_chunk)
    x = x + attn.output(o)
    x = x + _mlp(dims, p["mlp"], _norm(dims, p["mlp_norm"], x))
    ks.append(k)
    vs.append(v)
  logical = np.argsort(lay.pos)  # physical index of each logical slot
  last = int(logical[(n - 1) * g + plan.readout])
  logits = _logits(dims, params, x[:, last:last + 1])[:, 0]

  cache = init_cache(dims, plan, b, max_tokens)
  k_all = jnp.stack(ks)[:, :, logical].reshape(dims.n_layers, b, n, g, dims.n_heads, dims.head_dim)
  v_all = jnp.stack(vs)[:, :, logical].reshape(k_all.shape)
  pers = list(plan.persistent_slots)
  if pers:
    npp = len(pers) * n
    cache["k"] = cache["k"].at[:, :, :npp].set(k_all[:, :, :, pers].reshape(dims.n_layers, b, npp, *k_all.shape[-2:]))
    cache["v"] = cache["v"].at[:, :, :npp].set(v_all[:, :, :, pers].reshape(dims.n_layers, b, npp, *k_all.shape[-2:]))
    tok = np.repeat(np.arange(n, dtype=np.int32), len(pers))
    pos = tok * g + np.tile(np.asarray(pers, np.int32), n)
    cache["p_pos"] = cache["p_pos"].at[:npp].set(pos)
    cache["p_tok"] = cache["p_tok"].at[:npp].set(tok)
    cache["p_valid"] = cache["p_valid"].at[:npp].set(1)
  ring = plan.ring_size
  if ring:
    (j,) = plan.temporary_slots
    toks = np.arange(max(0, n - ring), n, dtype=np.int32)
    idx = toks % ring
    cache["rk"] = cache["rk"].at[:, :, idx].set(k_all[:, :, toks, j])
    cache["rv"] = cache["rv"].at[:, :, idx].set(v_all[:, :, toks, j])
    cache["r_pos"] = cache["r_pos"].at[idx].set(toks * g + j)
    cache["r_tok"] = cache["r_tok"].at[idx].set(toks)
    cache["r_valid"] = cache["r_valid"].at[idx].set(1)
  return logits, cache


# ----------------------------------------------------------------------------- one decode step


def decode_step(dims, plan: SlotPlan, params, cache, token_B, index):
  """Feeds token `index` (a traced int32 scalar, the token's position) and returns
  (its read-out logits [B, V], the updated cache)."""
  g = plan.group
  x = _embed(dims, params, plan, token_B[:, None])[:, 0]  # [B, G, D]
  j = jnp.arange(g, dtype=jnp.int32)
  q_tok = jnp.full((g,), index, jnp.int32)
  q_fields = {"pos": index * g + j, "tok": q_tok, "kind": jnp.asarray(plan.kinds, jnp.int32),
              "segment": jnp.ones((g,), jnp.int32)}
  k_fields = {
      "pos": jnp.concatenate([cache["p_pos"], cache["r_pos"], q_fields["pos"]]),
      "tok": jnp.concatenate([cache["p_tok"], cache["r_tok"], q_tok]),
      "kind": jnp.concatenate([jnp.full(cache["p_pos"].shape, P, jnp.int32),
                               jnp.full(cache["r_pos"].shape, T_, jnp.int32), q_fields["kind"]]),
      "segment": jnp.concatenate([cache["p_valid"], cache["r_valid"], q_fields["segment"]]),
  }
  pers, temps = list(plan.persistent_slots), list(plan.temporary_slots)
  p_at = index * len(pers)
  ring = plan.ring_size
  r_at = index % ring if ring else 0
  new = dict(cache)
  ks, vs = [], []
  for i in range(dims.n_layers):
    p = layers.layer_params(params["trunk"], i)
    attn = _attn(dims, p["attn"])
    h = _norm(dims, p["attn_norm"], x)
    q = attn.project_q(h, q_tok)
    k, v = attn.project_kv(h, q_tok)
    keys = jnp.concatenate([cache["k"][i], cache["rk"][i], k], axis=1)
    values = jnp.concatenate([cache["v"][i], cache["rv"][i], v], axis=1)
    o, _ = attention.attend_dense(q, keys, values, plan.rule, q_fields, k_fields)
    x = x + attn.output(o)
    x = x + _mlp(dims, p["mlp"], _norm(dims, p["mlp_norm"], x))
    ks.append(k)
    vs.append(v)
  k_new, v_new = jnp.stack(ks), jnp.stack(vs)  # [L, B, G, H, Dh]
  if pers:
    new["k"] = jax.lax.dynamic_update_slice_in_dim(cache["k"], k_new[:, :, pers], p_at, axis=2)
    new["v"] = jax.lax.dynamic_update_slice_in_dim(cache["v"], v_new[:, :, pers], p_at, axis=2)
    pers_pos = index * g + jnp.asarray(pers, jnp.int32)
    new["p_pos"] = jax.lax.dynamic_update_slice(cache["p_pos"], pers_pos, (p_at,))
    new["p_tok"] = jax.lax.dynamic_update_slice(cache["p_tok"], jnp.full((len(pers),), index, jnp.int32), (p_at,))
    new["p_valid"] = jax.lax.dynamic_update_slice(cache["p_valid"], jnp.ones((len(pers),), jnp.int32), (p_at,))
  if ring:
    (jt,) = temps
    new["rk"] = jax.lax.dynamic_update_slice_in_dim(cache["rk"], k_new[:, :, jt:jt + 1], r_at, axis=2)
    new["rv"] = jax.lax.dynamic_update_slice_in_dim(cache["rv"], v_new[:, :, jt:jt + 1], r_at, axis=2)
    new["r_pos"] = cache["r_pos"].at[r_at].set(index * g + jt)
    new["r_tok"] = cache["r_tok"].at[r_at].set(index)
    new["r_valid"] = cache["r_valid"].at[r_at].set(1)
  logits = _logits(dims, params, x[:, plan.readout:plan.readout + 1])[:, 0]
  return logits, new


# ----------------------------------------------------------------------------- generation


def sample(logits_BV, rng, temperature):
  """Greedy where `temperature` is 0, else a draw from softmax(logits / temperature).
  `temperature` may be traced (one compiled program serves both)."""
  greedy = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  t = jnp.asarray(temperature, jnp.float32)
  drawn = jax.random.categorical(rng, logits_BV / jnp.where(t > 0, t, 1.0), axis=-1).astype(jnp.int32)
  return jnp.where(t > 0, drawn, greedy)


@functools.partial(jax.jit, static_argnums=(0, 1, 4))
def prefill_jit(dims, plan, params, prompt_BN, max_tokens: int):
  """Jitted `prefill`."""
  return prefill(dims, plan, params, prompt_BN, max_tokens)


@functools.partial(jax.jit, static_argnums=(0, 1, 5))
def decode_loop(dims, plan, params, cache, logits_BV, steps: int, temperature, start, rng):
  """Samples `steps` tokens starting from the prefill's logits: token k is drawn from logits k
  and (except the last) fed back at position `start + k`. Returns (tokens [B, steps],
  logits [B, steps, V], final cache)."""
  rngs = jax.random.split(rng, steps)
  first = sample(logits_BV, rngs[0], temperature)

  def body(carry, xs):
    cache, token = carry
    index, key = xs
    logits, cache = decode_step(dims, plan, params, cache, token, index)
    nxt = sample(logits, key, temperature)
    return (cache, nxt), (nxt, logits)

  idx = start + jnp.arange(steps - 1, dtype=jnp.int32)
  (cache, _), (toks, step_logits) = jax.lax.scan(body, (cache, first), (idx, rngs[1:]))
  tokens = jnp.concatenate([first[:, None], toks.T], axis=1)
  all_logits = jnp.concatenate([logits_BV[:, None], jnp.swapaxes(step_logits, 0, 1)], axis=1)
  return tokens, all_logits, cache


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
  dims, plan = family.dims, plan_for(family)
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
