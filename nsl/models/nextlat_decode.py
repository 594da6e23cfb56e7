"""NextLat's self-speculative decoder, drafting with its latent dynamics model
(docs/papers/nextlat.md#speculative-decoding).

The decoder a NextLat family's `Decoder.speculative` builds (nsl/models/decoder.py); `nsl.speculative`
measures it against plain decoding.

State between rounds: a KV cache holding tokens x_1..x_m, NextLat's latent h_m of x_m (the
trunk's final-normed state, or the residual stream before the final norm with
`nextlat.latent="residual"`; drafts are then read through the final norm), and a *pending*
token y (already emitted, not yet fed). One round with draft length k:

  draft    ĥ ← p_ψ(h_m, y); for j = 1..k: d_j ~ q_j = head(ĥ), ĥ ← p_ψ(ĥ, d_j)
           (no trunk call: the dynamics MLP and the tied head only);
  verify   one trunk forward of [y, d_1..d_k] at positions m..m+k with the KV cache, giving the
           model's own distributions p_0..p_k (p_{j-1} is the one d_j should come from);
  accept   Leviathan et al. (2023): d_j is kept with probability min(1, p_{j-1}(d_j)/q_j(d_j)),
           in order, up to the first rejection j*, where the new pending token is drawn from
           norm(max(0, p_{j*-1} - q_{j*})); when all k are kept it is drawn from p_k. Greedy
           (temperature 0): keep d_j iff it is argmax p_{j-1}; the new pending token is the argmax
           of the first disagreeing p. Either way the output has exactly the model's distribution
           (greedy: exactly plain greedy decoding, tested).

A round emits (accepted drafts + 1) tokens for one trunk forward of k+1 tokens; cache entries
written for rejected drafts lie beyond the new length and are overwritten by the next round
(keys past a query's position are masked). Batch size 1 (acceptance lengths differ per row).

The trunk with its KV cache is the shared one of every decoder (`nsl.decode.prefill_hidden` /
`extend`: `LatentLM`'s `layers.Stack` with a `kv_cache.KVCache`, visibility from the family's
rule); it serves both plain and speculative decoding so their speeds are compared on the same
code, and `nsl.decode.sample` draws every token. Each generation is one compiled
program (plain: a scan over tokens; speculative: a while loop over rounds), so neither pays a
host round trip per step. `measure` returns tokens/s and the mean accepted tokens per draft for
both, side by side (`nsl.speculative.measure`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from nsl import decode


def draft(step, draft_head, h_BD, pending_B, keys, k: int, temp):
  """k drafts [B, k] and their laws' logits q [B, k, V]: the dynamics model from the latent h of
  the last fed token and the pending token, then from each draft (no trunk call)."""
  hat = step(h_BD[:, None], pending_B[:, None])  # [B, 1, D]
  drafts, q_logits = [], []
  for j in range(k):
    ql = draft_head(hat)[:, 0]
    d = decode.sample(ql, keys[j], temp)
    drafts.append(d)
    q_logits.append(ql)
    if j < k - 1:
      hat = step(hat, d[:, None])
  return jnp.stack(drafts, axis=1), jnp.stack(q_logits, axis=1)


def accept(drafts_BK, q_BKV, p_logits, keys, k: int, temp):
  """(accepted drafts n, the new pending token [B]) of a round (module docstring, "accept"):
  `p_logits` [B, k+1, V] the trunk's laws after the pending token and each draft, batch 1."""
  if temp == 0:
    ok = drafts_BK == decode.argmax(p_logits[:, :k])
  else:
    pp = jax.nn.softmax(p_logits[:, :k] / temp, axis=-1)
    qq = jax.nn.softmax(q_BKV / temp, axis=-1)
    pick = lambda a: jnp.take_along_axis(a, drafts_BK[..., None], axis=-1)[..., 0]
    u = jax.random.uniform(keys[k], drafts_BK.shape)
    ok = u * pick(qq) < pick(pp)  # u < p/q without dividing by 0
  n_acc = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)[0]  # batch 1
  p_next = p_logits[:, n_acc]  # [B, V]
  if temp == 0:
    return n_acc, decode.argmax(p_next)
  pn = jax.nn.softmax(p_next / temp, axis=-1)
  qn = jax.nn.softmax(q_BKV[:, jnp.minimum(n_acc, k - 1)] / temp, axis=-1)
  resid = jnp.maximum(pn - qn, 0.0)
  resid_ok = jnp.sum(resid, axis=-1, keepdims=True) > 0
  law = jnp.where((n_acc < k) & resid_ok, resid, pn)
  return n_acc, jax.random.categorical(keys[k + 1], jnp.log(jnp.maximum(law, 1e-30)), axis=-1).astype(jnp.int32)


class Decoder:
  """Plain and self-speculative decoding of a trained `nextlat` model (batch size 1)."""

  def __init__(self, family, params, draft_len: int | None = None, temperature: float = 0.0):
    """Built by a NextLat family's `Decoder.speculative` (`nsl.models.decoder`), which has the
    dynamics model this drafts with."""
    self.family, self.params, self.dims = family, params, family.dims
    self.k = int(draft_len if draft_len is not None else family.spec.draft_len)  # NextLatSpec
    self.temperature = float(temperature)
    model, dims, k, temp = family.model, self.dims, self.k, self.temperature
    plan = family.slot_plan()
    head = lambda p, h: model.apply({"params": p}, h, method="logits")  # the trunk's final-normed h
    draft_head = lambda p, z: model.apply({"params": p}, z, method="latent_logits")  # a latent ĥ
    step = lambda p, z, t: model.apply({"params": p}, z, t, method="step")
    # The dynamics model runs in NextLat's latent space (NextLatSpec.latent): the final-normed h,
    # or the residual stream before the final norm, which the trunk then returns beside h.
    residual = family.spec.latent == "residual"
    latent_and_h = (lambda out: out) if residual else (lambda out: (out, out))

    def prefill(p, prompt_BN, max_tokens: int, key):
      out, cache = decode.prefill_hidden(dims, plan, p, prompt_BN, max_tokens, with_residual=residual)
      z, h = latent_and_h(out)
      return decode.sample(head(p, h[:, None])[:, 0], key, temp), z, cache

    # Both token loops run on the cache's per-layer form with the trunk's layers as separate
    # arrays (`lp`, `decode.token_loop_params`; nsl/decode.py `decode_loop` says why). At d 512 x
    # 8 layers plain decoding got 1.4x faster; speculative rounds (k = 4) within run-to-run noise.
    def plain_step(p, lp, cache, token_B, start, key):
      out, cache = decode.extend(dims, plan, lp, cache, token_B[:, None], start, with_residual=residual)
      z, h = latent_and_h(out)
      return decode.sample(head(p, h)[:, 0], key, temp), z[:, 0], cache

    def spec_round(p, lp, cache, h_BD, pending_B, start, key):
      keys = jax.random.split(key, k + 2)
      drafts_BK, q_BKV = draft(lambda z, t: step(p, z, t), lambda z: draft_head(p, z), h_BD, pending_B, keys, k, temp)
      seq = jnp.concatenate([pending_B[:, None], drafts_BK], axis=1)  # [B, k+1]
      out, cache = decode.extend(dims, plan, lp, cache, seq, start, with_residual=residual)
      z, h = latent_and_h(out)
      p_logits = head(p, h)  # [B, k+1, V]; p_logits[:, j] is the law of the token after seq[:, j]
      n_acc, nxt = accept(drafts_BK, q_BKV, p_logits, keys, k, temp)
      return n_acc, drafts_BK, nxt, z[:, n_acc], cache

    # Whole generations run on the device (a scan, a while loop): the comparison measures
    # decoding, not one host round trip per token or per round.
    self._plain, self._spec = self._loops(prefill, plain_step, spec_round)

  def _loops(self, prefill, plain_step, spec_round):
    """The jitted plain (a scan over tokens) and speculative (a while loop over rounds) programs."""
    dims, k = self.dims, self.k

    def plain_loop(p, prompt_BN, rng, new: int):
      n, keys_T = prompt_BN.shape[1], jax.random.split(rng, new)
      tok, _, cache = prefill(p, prompt_BN, n + new + 1, keys_T[0])
      lp, cache = decode.token_loop_params(dims, p), cache.per_layer()

      def body(carry, xs):
        cache, tok = carry
        i, key = xs
        nxt, _, cache = plain_step(p, lp, cache, tok, n + i - 1, key)
        return (cache, nxt), tok[0]

      (_, last), toks = jax.lax.scan(body, (cache, tok), (jnp.arange(1, new, dtype=jnp.int32), keys_T[1:]))
      return jnp.concatenate([toks, last])

    def spec_loop(p, prompt_BN, rng, new: int):
      n = prompt_BN.shape[1]
      rng, key = jax.random.split(rng)
      pending, h, cache = prefill(p, prompt_BN, n + new + k + 2, key)
      lp, cache = decode.token_loop_params(dims, p), cache.per_layer()
      out = jnp.zeros((new + k + 1,), jnp.int32).at[0].set(pending[0])
      accepted = jnp.zeros((new,), jnp.int32)
      slots = jnp.arange(k + 1)

      def body(c):
        cache, h, pending, m, count, rounds, out, accepted, rng = c
        rng, key = jax.random.split(rng)
        n_acc, drafts, pending, h, cache = spec_round(p, lp, cache, h, pending, m, key)
        # The round's tokens: the n_acc accepted drafts, then the new pending token; what lies
        # past them is overwritten by the next round or cut at the end.
        row = jnp.where(slots < n_acc, jnp.concatenate([drafts[0], jnp.zeros((1,), jnp.int32)]), pending[0])
        out = jax.lax.dynamic_update_slice(out, row, (count,))
        return (cache, h, pending, m + n_acc + 1, count + n_acc + 1, rounds + 1, out,
                accepted.at[rounds].set(n_acc), rng)

      c = (cache, h, pending, jnp.int32(n), jnp.int32(1), jnp.int32(0), out, accepted, rng)
      c = jax.lax.while_loop(lambda c: c[4] < new, body, c)
      return c[6][:new], c[7], c[5]

    return jax.jit(plain_loop, static_argnums=3), jax.jit(spec_loop, static_argnums=3)

  def generate(self, prompt, new_tokens: int, rng=None) -> np.ndarray:
    """Plain KV-cache decoding: `new_tokens` tokens after `prompt` [N] (one trunk call each)."""
    rng = jax.random.PRNGKey(0) if rng is None else rng
    prompt = jnp.asarray(prompt, jnp.int32).reshape(1, -1)
    return np.asarray(self._plain(self.params, prompt, rng, int(new_tokens)))

  def generate_speculative(self, prompt, new_tokens: int, rng=None) -> tuple[np.ndarray, dict[str, Any]]:
    """Self-speculative decoding; returns (tokens [new_tokens], stats with the accepted drafts
    of every round)."""
    rng = jax.random.PRNGKey(0) if rng is None else rng
    prompt = jnp.asarray(prompt, jnp.int32).reshape(1, -1)
    out, accepted, rounds = self._spec(self.params, prompt, rng, int(new_tokens))
    rounds = int(rounds)
    return np.asarray(out), {"accepted": [int(a) for a in np.asarray(accepted)[:rounds]], "rounds": rounds}
