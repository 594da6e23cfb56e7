"""The one KV cache of every cached decoder, read and written inside `layers.Attention`.

`layers.Attention`, `Block` and `Stack` take an optional `(cache, step)` and then return
`(cache, y)` (Flax gemma's `(x, cache) -> (cache, y)`): one path, one parameter tree, for
training (no cache), prefill and decode (docs/design.md#families). A *step* describes
the new slots of one call: their per-slot metadata (`pos`, `tok`, `kind`, `segment`, as in
`nsl.nn.masks`) and the cache entry each one is written to.

Layout of the cache, per layer and row (docs/papers/sps.md#kv-cache): the first
`n_persistent` entries hold persistent slots in token order (slot r of token t at `t·P + r`,
P = persistent slots per token), then a **ring** of `ring` = w entries holding the temporary slot
of the last w tokens (token t at `n_persistent + t mod w`). A query at token t sees temporary keys
of tokens t-w..t, of which t itself is among the new slots, so w past tokens suffice and older
ones are overwritten. Per-slot metadata lives beside the K/V: `pos`, `tok`, `kind` [S] and
`segment` [B, S] (the document id; `EMPTY` where nothing was written), so visibility in decode
is the family's `masks.Rule` (`masks.visible`, as in training), with `attention.attend_dense`'s softmax.

Reads see the cache as it was before the step plus the step's own K/V; entries of tokens at or
after the step's first token are stale (a self-speculative round's rejected drafts) and masked.

K/V are stored head-major, K transposed: K [L, B, H, Dh, S], V [L, B, H, S, Dh], so both decode
attention dots (scores q·Kᵀ and p·V) read a layer's slice in their canonical operand layout
(batch dims B, H major; [Dh, S] resp. [S, Dh] matrices), and a cached step scores the cached
keys and its own keys separately (`attend`): no cache-sized concatenation. Why: a slot-major
[L, B, S, H, Dh] cache concatenated with the new keys made XLA transpose-copy every layer's K
and V on every decoded token (about 70% of an XS decode step on CPU), and with K not transposed
the two-query (SPS) score dot ran ~4x slower than the one-query dot of the standard model.

**Per-layer form** (`per_layer()`; `stacked()` undoes it): K and V as tuples of L separate
arrays, for a token loop whose layers are unrolled (`nsl.decode.decode_loop`). Why: a scanned
layer reads its weights and K/V as dynamic slices of the stacked arrays, and XLA:CPU copies
every slice before its dot (it cannot hand a matmul a view), so an XS decode step moved each
layer's 13.6 MB of weights and 21 MB of K/V twice; separate buffers are read in place (measured
on 2 cores: 8 layers of decode-shaped matmuls 17.9 ms scanned, 9.8 ms on separate arrays, 36.8
ms on static slices of the stacked ones).
"""

from __future__ import annotations

import functools
import math
import operator

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from nsl.nn import masks
from nsl.kernels import decode_cpu, registry

# Up to this many queries per step score the cached keys one matrix-vector product each (Eigen's
# GEMV): XLA:CPU hands a 2-row product to YNNPACK, which at XS took 1.4 ms a layer against 0.47 +
# 0.18 ms for two GEMVs (the second finds the layer's K in L3). SPS steps have 2; a speculative round more.
GEMV_QUERIES = 4
# A step of up to this many slots writes them with one dynamic-update-slice each (`_write_slots`).
DUS_SLOTS = 4
EMPTY = -1  # segment of an unwritten entry: equal to no query's document id (those are >= 0)


def attend_parts(q, parts, return_lse: bool = False):
  """One softmax of queries q [B, Q, H, Dh] over the union of key parts, each scored and weighted
  apart (no concatenation): `parts` = [(k, v, visible [B, 1|H, Q, K], head_major)], K/V either
  head-major (K [B, H, Dh, K], V [B, H, K, Dh], a cache's layout) or token-major ([B, K, H, Dh],
  a step's own keys). -> out [B, Q, H, Dh] (q's dtype), with `return_lse` also the log-sum-exp
  [B, H, Q] (-inf where nothing is visible; `attention.merge_lse` merges it with another part)."""
  f32 = jnp.float32
  scale = 1.0 / math.sqrt(q.shape[-1])
  scores = []
  for k, _, vis, head_major in parts:
    if head_major and 1 < q.shape[1] <= GEMV_QUERIES:
      s = jnp.stack([jnp.einsum("bhd,bhdk->bhk", q[:, i], k.astype(q.dtype), preferred_element_type=f32)
                     for i in range(q.shape[1])], axis=2) * scale
    else:
      s = jnp.einsum("bqhd,bhdk->bhqk" if head_major else "bqhd,bkhd->bhqk", q, k.astype(q.dtype),
                     preferred_element_type=f32) * scale
    scores.append(jnp.where(vis, s, -jnp.inf))
  m = functools.reduce(jnp.maximum, [jnp.max(s, axis=-1, keepdims=True) for s in scores])
  m_safe = jnp.where(jnp.isneginf(m), 0.0, m)
  probs = [jnp.exp(s - m_safe) for s in scores]
  l = functools.reduce(operator.add, [jnp.sum(p, axis=-1, keepdims=True) for p in probs])
  inv = 1.0 / jnp.where(l == 0, 1.0, l)
  out_BHQD = functools.reduce(operator.add, [
      jnp.einsum("bhqk,bhkd->bhqd" if head_major else "bhqk,bkhd->bhqd", p * inv, v.astype(f32))
      for p, (_, v, _, head_major) in zip(probs, parts)])
  out = jnp.swapaxes(out_BHQD, 1, 2).astype(q.dtype)
  if not return_lse:
    return out
  l = l[..., 0]
  return out, jnp.where(l == 0, -jnp.inf, m_safe[..., 0] + jnp.log(jnp.where(l == 0, 1.0, l)))


def head_major(k_BSHD, v_BSHD):
  """K [B, H, Dh, S] and V [B, H, S, Dh] (the cache's layout) of token-major K/V [B, S, H, Dh]."""
  return jnp.transpose(k_BSHD, (0, 2, 3, 1)), jnp.swapaxes(v_BSHD, 1, 2)


@flax.struct.dataclass
class Step:
  """The new slots of one cached call: metadata [S] (segment [B, S]) and cache entries `write`
  [S] (out of range = not kept). `prefill`: nothing in the cache is visible to these slots (a
  prompt into an empty cache), so they attend among themselves with `attention.attend` under a
  static layout, the training path."""

  pos: jax.Array
  tok: jax.Array
  kind: jax.Array
  segment: jax.Array
  write: jax.Array
  prefill: bool = flax.struct.field(pytree_node=False, default=False)
  # (sin, cos) [S, head_dim/2] of the slots' RoPE angles (`layers.rope_table`), when a token loop
  # made its table once before the loop; None: `layers.rope` computes them from `tok`.
  rope: tuple[jax.Array, jax.Array] | None = None

  def fields(self) -> dict[str, jax.Array]:
    return {"pos": self.pos, "tok": self.tok, "kind": self.kind, "segment": self.segment}


@flax.struct.dataclass
class KVCache:
  """K [L, B, H, Dh, S] and V [L, B, H, S, Dh] of every layer, and the per-slot metadata (module
  docstring)."""

  k: jax.Array
  v: jax.Array
  pos: jax.Array  # [S]
  tok: jax.Array  # [S]
  kind: jax.Array  # [S]
  segment: jax.Array  # [B, S]; EMPTY = never written
  kinds: tuple[int, ...] = flax.struct.field(pytree_node=False, default=(masks.PERSISTENT,))
  ring: int = flax.struct.field(pytree_node=False, default=0)
  # A layer view (`layer_view`): k/v hold one layer ([1, B, H, Dh, S], [1, B, H, S, Dh]) and `write_kv` records the
  # step's K/V [B, S_new, H, Dh] here instead of scattering (`write_layers` writes them once).
  k_new: jax.Array | None = None
  v_new: jax.Array | None = None
  view: bool = flax.struct.field(pytree_node=False, default=False)

  @staticmethod
  def create(dims, batch: int, max_tokens: int, kinds=(masks.PERSISTENT,), ring: int = 0) -> "KVCache":
    """An empty cache for `max_tokens` tokens whose slot groups have `kinds` (one per slot;
    at most one temporary slot, kept in a ring of `ring` tokens)."""
    kinds = tuple(int(k) for k in kinds)
    n_temp = sum(k == masks.TEMPORARY for k in kinds)
    if n_temp > 1 or (ring and not n_temp):
      raise ValueError(f"kinds {kinds} with ring {ring}: at most one temporary slot per token, and a ring only with one")
    s = (len(kinds) - n_temp) * max_tokens + ring
    lbh = (dims.n_layers, batch, dims.n_heads)
    zeros = lambda *sh: jnp.zeros(sh, jnp.int32)
    return KVCache(k=jnp.zeros(lbh + (dims.head_dim, s), dims.compute_dtype),
                   v=jnp.zeros(lbh + (s, dims.head_dim), dims.compute_dtype),
                   pos=zeros(s), tok=zeros(s), kind=zeros(s), segment=jnp.full((batch, s), EMPTY, jnp.int32),
                   kinds=kinds, ring=int(ring))

  @property
  def size(self) -> int:
    return int(self.v[0].shape[-2])  # a layer's V is [B, H, S, Dh] in either form

  @property
  def is_per_layer(self) -> bool:
    return isinstance(self.k, tuple)

  def per_layer(self) -> "KVCache":
    """The same cache with K/V as tuples of per-layer arrays (module docstring): one copy, made
    once before a token loop, so the loop reads and updates each layer's buffer in place."""
    if self.is_per_layer:
      return self
    return self.replace(k=tuple(self.k[i] for i in range(self.k.shape[0])),
                        v=tuple(self.v[i] for i in range(self.v.shape[0])))

  def stacked(self) -> "KVCache":
    """The stacked form K [L, B, H, Dh, S], V [L, B, H, S, Dh] of a `per_layer` cache."""
    if not self.is_per_layer:
      return self
    return self.replace(k=jnp.stack(self.k), v=jnp.stack(self.v))

  @property
  def n_persistent(self) -> int:
    return self.size - self.ring

  def step(self, pos, tok, kind, segment, prefill: bool = False) -> Step:
    """The Step of new slots with metadata `pos`, `tok`, `kind` [S] and `segment` [B, S]
    (`pos = G·tok + j` for slot j of a token's group, `masks.Layout.grouped`): where each one
    is written. A temporary slot is kept only if its token is among the step's last `ring`."""
    g = len(self.kinds)
    pos, tok, kind = (jnp.asarray(a, jnp.int32) for a in (pos, tok, kind))
    rank = jnp.asarray(np.maximum(np.cumsum(np.asarray(self.kinds) == masks.PERSISTENT) - 1, 0), jnp.int32)
    n_pers = sum(k == masks.PERSISTENT for k in self.kinds)
    at_p = tok * n_pers + rank[pos - g * tok]
    at_p = jnp.where(at_p < self.n_persistent, at_p, self.size)  # past the end: not kept
    # A temporary slot outside the ring (w = 0: never seen again; or an older token of a long
    # step) gets an out-of-range index, so no two new slots write one entry.
    kept = tok > jnp.max(tok) - self.ring
    at_t = jnp.where(kept, self.n_persistent + tok % max(self.ring, 1), self.size)
    write = jnp.where(kind == masks.PERSISTENT, at_p, at_t)
    return Step(pos=pos, tok=tok, kind=kind, segment=jnp.asarray(segment, jnp.int32), write=write, prefill=prefill)

  def _visible(self, q, num_new: int, rule: masks.Rule, step: Step, queries=None):
    """([B, 1, Sq, S] over the cached entries, [B, 1, Sq, num_new] over the step's own slots):
    visibility under `rule` on explicit per-slot fields (positions are dynamic here), one mask for
    every head. Entries of tokens at or after the step's first are stale (a rejected draft)."""
    stale = self.tok[None, :] >= jnp.min(step.tok)
    cached = {"pos": self.pos, "tok": self.tok, "kind": self.kind, "segment": jnp.where(stale, EMPTY, self.segment)}
    q_fields = step.fields() if queries is None else {n: a[..., np.asarray(queries)] for n, a in step.fields().items()}
    q_meta = {n: a[..., :, None] for n, a in q_fields.items()}

    def visible(k_fields, num_keys):
      mask = masks.visible(rule, q_meta, {n: a[..., None, :] for n, a in k_fields.items()})
      return jnp.broadcast_to(mask, (q.shape[0], q.shape[1], num_keys))[:, None]

    return visible(cached, self.size), visible(step.fields(), num_new)

  def attend(self, q, k_new, v_new, rule: masks.Rule, step: Step, layer, return_lse: bool = False, queries=None):
    """Attention of the step's queries [B, Sq, H, Dh] over layer `layer`'s cached keys plus the
    step's own K/V [B, Sq, H, Dh], under `rule` (`_visible`); with `return_lse` also the
    log-sum-exp [B, H, Sq] (to merge with another attention, `merge_lse`).
    `attention.attend_dense`'s softmax over cache + new keys, with the two parts scored and
    weighted separately: no cache-sized concatenation (module docstring); on one CPU device one
    `nsl.kernels.decode_cpu` call where the kernel registry picks it, which reads the layer's K/V
    once for all the queries.
    `queries`: q holds only these of the step's slots (static indices; `layers.Attention`)."""
    vis_c, vis_n = self._visible(q, k_new.shape[1], rule, step, queries)
    k_c, v_c = self.k[layer], self.v[layer]
    if registry.pick_call("decode", q, k_c) == "decode_cpu":
      out, lse = decode_cpu.attend(q, k_c, v_c, vis_c[:, 0], k_new, v_new, vis_n[:, 0])
      return (out.astype(q.dtype), lse) if return_lse else out.astype(q.dtype)
    return attend_parts(q, [(k_c, v_c, vis_c, True), (k_new, v_new, vis_n, False)], return_lse)

  def attend_write(self, q, k_new, v_new, rule: masks.Rule, step: Step, layer, queries=None):
    """`attend`, then the step's K/V written (`write_kv`): -> (cache, out). On a per-layer cache
    and one CPU device, one `decode_cpu.attend_write` call that writes the new entries in place
    after its reads (XLA's separate update of the transposed K touched B·H·Dh scattered lines per
    slot: 0.9 ms of a standard XS decode step, 1.5 ms of an SPS one, which writes two slots)."""
    k_c = self.k[layer]
    if self.is_per_layer and not self.view and registry.pick_call("decode", q, k_c) == "decode_cpu":
      vis_c, vis_n = self._visible(q, k_new.shape[1], rule, step, queries)
      out, _, k_l, v_l = decode_cpu.attend_write(q, k_c, self.v[layer], vis_c[:, 0], k_new, v_new, vis_n[:, 0],
                                                 step.write)
      put = lambda t, a: t[:layer] + (a,) + t[layer + 1:]
      return self.replace(k=put(self.k, k_l), v=put(self.v, v_l)), out.astype(q.dtype)
    out = self.attend(q, k_new, v_new, rule, step, layer, queries=queries)
    return self.write_kv(layer, k_new, v_new, step, after=out), out

  def write_kv(self, layer, k_new, v_new, step: Step, after=None) -> "KVCache":
    """Writes one layer's new K/V [B, S, H, Dh] at `step.write` (indices out of range dropped).
    The layer index and the slot indices are advanced indices, so the update is [S, B, H, Dh].
    On a `layer_view` it only records them (k_new / v_new) for `write_layers`.

    `after` (per-layer form): the attention output read from this layer's cache, same shape as
    k_new. The update is made to depend on it (k + 0·after, exact for a finite output), so XLA
    writes the buffer in place after the reads: with the write and the reads unordered it copied
    each layer's K and V twice per token instead (measured: 8 decode-shaped layers 16 -> 2.5 ms
    per step on 2 cores; an optimization barrier did not order them)."""
    if self.view:
      return self.replace(k_new=k_new.astype(self.k.dtype), v_new=v_new.astype(self.v.dtype))
    if self.is_per_layer:  # layer is a Python int here: replace that layer's buffer
      if after is not None:  # `after` of only some slots (a last layer's `queries`): one row orders it as well
        zero = 0.0 * (after if after.shape == k_new.shape else jnp.sum(after, 1, keepdims=True)).astype(k_new.dtype)
        k_new, v_new = k_new + zero, v_new + zero
      k_t, v_t = head_major(k_new.astype(self.k[layer].dtype), v_new.astype(self.v[layer].dtype))
      if k_t.shape[-1] <= DUS_SLOTS:
        k_l, v_l = self._write_slots(self.k[layer], self.v[layer], k_t, v_t, step.write)
      else:
        k_l = self.k[layer].at[..., step.write].set(k_t, mode="drop")
        v_l = self.v[layer].at[:, :, step.write].set(v_t, mode="drop")
      put = lambda t, a: t[:layer] + (a,) + t[layer + 1:]
      return self.replace(k=put(self.k, k_l), v=put(self.v, v_l))
    # k [L, B, H, Dh, S]: layer and slot indices are separated, so the update is [S, B, H, Dh]
    k = self.k.at[layer, :, :, :, step.write].set(jnp.swapaxes(k_new, 0, 1).astype(self.k.dtype), mode="drop")
    v = self.v.at[layer, :, :, step.write].set(jnp.swapaxes(v_new, 0, 1).astype(self.v.dtype), mode="drop")
    return self.replace(k=k, v=v)

  def _write_slots(self, k_l, v_l, k_t, v_t, write):
    """One layer's K [B, H, Dh, S] / V [B, H, S, Dh] with new slot j's K/V written at entry
    write[j] (skipped when out of range), one in-place dynamic-update-slice per slot. Why: a step
    of several slots (SPS: the persistent x_i and the ring's ρ_i) was a scatter, which XLA:CPU
    runs element by element."""
    for j in range(k_t.shape[-1]):
      at = jnp.minimum(write[j], self.size - 1)
      keep = write[j] < self.size
      k_j = jnp.where(keep, k_t[..., j:j + 1], jax.lax.dynamic_slice_in_dim(k_l, at, 1, axis=-1))
      v_j = jnp.where(keep, v_t[..., j:j + 1, :], jax.lax.dynamic_slice_in_dim(v_l, at, 1, axis=-2))
      k_l = jax.lax.dynamic_update_slice_in_dim(k_l, k_j, at, axis=-1)
      v_l = jax.lax.dynamic_update_slice_in_dim(v_l, v_j, at, axis=-2)
    return k_l, v_l

  def layer_view(self, k_l, v_l) -> "KVCache":
    """The cache as one layer of a layer scan sees it: that layer's K `k_l` [B, H, Dh, S] and V `v_l`
    [B, H, S, Dh]
    (the scanned slice) as layer 0, the shared metadata, and `write_kv` deferred. Why: a scatter
    into the full [L, ...] cache inside the scan carry is not done in place by XLA, so every
    layer copied the whole cache (2·L cache copies per decoded token); reading slices and writing
    all layers once after the scan (`write_layers`) keeps the token loop's update in place."""
    return self.replace(k=k_l[None], v=v_l[None], k_new=None, v_new=None, view=True)

  def write_layers(self, k_new_L, v_new_L, step: Step) -> "KVCache":
    """Writes every layer's new K/V [L, B, S_new, H, Dh] at `step.write` in one scatter
    (out-of-range indices dropped): the single cache update of a scanned cached call. The slot
    index is the only advanced index, so the updates are [L, B, H, Dh, S_new] and [L, B, H, S_new, Dh]."""
    k = self.k.at[..., step.write].set(jnp.transpose(k_new_L, (0, 1, 3, 4, 2)).astype(self.k.dtype), mode="drop")
    v = self.v.at[:, :, :, step.write].set(jnp.swapaxes(v_new_L, 2, 3).astype(self.v.dtype), mode="drop")
    return self.replace(k=k, v=v)

  def commit(self, step: Step) -> "KVCache":
    """Writes the step's metadata (after every layer has written its K/V)."""
    put = lambda c, x: c.at[step.write].set(x, mode="drop")
    return self.replace(pos=put(self.pos, step.pos), tok=put(self.tok, step.tok), kind=put(self.kind, step.kind),
                        segment=self.segment.at[:, step.write].set(step.segment, mode="drop"))

  def nbytes(self) -> dict[str, int]:
    """Bytes allocated: K/V of the persistent part, of the ring, and the slot metadata."""
    ks = self.k if self.is_per_layer else (self.k,)
    per_entry = 2 * sum(a.size for a in ks) // self.size * ks[0].dtype.itemsize  # K and V of one entry
    meta = sum(int(a.size * a.dtype.itemsize) for a in (self.pos, self.tok, self.kind, self.segment))
    out = {"persistent": self.n_persistent * per_entry, "ring": self.ring * per_entry, "metadata": meta}
    out["total"] = sum(out.values())
    return out
