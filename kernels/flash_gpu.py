"""GPU (Pallas, Triton backend): block-sparse flash attention under an nsl mask rule.

`attend(q, k, v, rule, q_slots, k_slots)` -> (out [B, Sq, H, D] in q.dtype, lse [B, H, Sq] f32),
differentiable in q, k and v (custom VJP). It is the contract of `nsl.nn.attention.attend(...,
impl='pallas_gpu')`.

How it works:
- On the host, `nsl.kernels.rules.tile_lists` turns the static rule + layouts into, for every query
  tile, the list of its non-empty key tiles (and the transpose for the dk/dv kernel). Each
  program of the forward and dq kernels loops over exactly the non-empty key tiles of its query
  tile; each program of the dk/dv kernel loops over the non-empty query tiles of its key tile.
  Empty tiles are never loaded.
- Inside a tile the rule is evaluated per element by `nsl.nn.masks.visible` on the tile's metadata:
  the static layout fields (pos / tok / kind, passed as int32 inputs, only those the rule reads)
  and the dynamic segment / block ids. Masked scores are -inf and the running max is guarded,
  so rows with no visible key give out = 0 and lse = -inf, exactly like the dense reference;
  two attentions over disjoint key sets then merge exactly (`nsl.nn.attention.merge_lse`).
- Backward is flash-attention-2 style: delta = rowsum(dO·O) − dlse (the lse cotangent folded
  in) in XLA, then a dq kernel over query tiles and a dk/dv kernel over key tiles, both
  recomputing probabilities from the saved lse.

Constraints (a `ConfigError` otherwise, never wrong numbers): equal head dims for q, k, v and a
power of two >= 16 (Triton `dot`); equal head counts; tiles are powers of two in [16, 128]
dividing the sequence lengths. A requested block above 128 (the XLA path's default chunk is 512)
is lowered to the largest power of two <= 128 dividing the length: tile sizes change speed,
never results. fp32 inputs use full-precision dots (no TF32) unless `allow_tf32=True`.

Sharding, as splash's: with a mesh (`mesh=` or the context mesh), the call runs under
`shard_map` (`nsl.kernels.common.shard_over_mesh`) with the batch split over the mesh axes among
('data', 'fsdp') that divide it and the heads over 'tensor' when it divides the head count, the
dynamic segment / block ids split with the batch; each GPU runs the kernel on its own rows and
heads (a Pallas call is opaque to XLA's partitioner, which would otherwise gather it whole).

`interpret=None` runs the kernels compiled on GPU and in Pallas interpret mode elsewhere (CPU
tests). Only interpret mode has been run so far (on CPU, also under shard_map on 8 devices); the
Triton lowering is unverified on hardware: `tools/gpu_check.sh` is the check prepared for a GPU
(docs/guide/accelerators.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from nsl import sharding
from nsl.nn import masks
from nsl.errors import ConfigError
from nsl.kernels import rules
from nsl.kernels.common import attention_with_vjp, context_mesh, shard_over_mesh

MAX_BLOCK = 128
MIN_BLOCK = 16


def _on_gpu() -> bool:
  return sharding.platform() == "gpu"


def _pick_block(requested: int, length: int, what: str) -> int:
  b = 1 << (max(1, min(int(requested), MAX_BLOCK, length)).bit_length() - 1)
  while b >= MIN_BLOCK and length % b:
    b //= 2
  if b < MIN_BLOCK:
    raise ConfigError(
        f"pallas_gpu: {what} length {length} needs a power-of-two tile in [{MIN_BLOCK}, {MAX_BLOCK}] "
        f"that divides it (requested {requested}); pad the sequence or use attention_impl='chunked'")
  return b


def _static_fields(rule: masks.Rule) -> tuple[str, ...]:
  """Layout fields that `visible` reads for this rule."""
  names = set()
  if rule.causal:
    names.add("pos")
  if rule.window is not None or rule.persistent_window is not None:
    names |= {"tok", "kind"}
  if rule.block == "earlier" and rule.sink:
    names.add("tok")
  return tuple(n for n in ("pos", "tok", "kind") if n in names)


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Everything static about one call: hashable, a nondiff argument of the custom VJP."""

  rule: masks.Rule
  q_layout: masks.Layout
  k_layout: masks.Layout
  block_q: int
  block_k: int
  interpret: bool
  precision: lax.Precision | None
  num_warps: int
  num_stages: int

  @property
  def tiles(self) -> rules.TileLists:
    return rules.tile_lists(self.rule, self.q_layout, self.k_layout, self.block_q, self.block_k)

  @property
  def static_fields(self) -> tuple[str, ...]:
    return _static_fields(self.rule)


def _check(q, k, v, q_slots, k_slots) -> None:
  b, sq, h, d = q.shape
  sk = k.shape[1]
  if k.shape != (b, sk, h, d) or v.shape != k.shape:
    raise ConfigError(f"pallas_gpu: q {q.shape}, k {k.shape}, v {v.shape} must share batch, heads "
                      "and head dim (no GQA/MQA in this kernel)")
  if d < MIN_BLOCK or d & (d - 1):
    raise ConfigError(f"pallas_gpu: head dim {d} must be a power of two >= {MIN_BLOCK} "
                      "(Triton dot); use attention_impl='chunked'")
  if q_slots.layout.num_slots != sq or k_slots.layout.num_slots != sk:
    raise ConfigError(f"pallas_gpu: layouts have {q_slots.layout.num_slots}/{k_slots.layout.num_slots} "
                      f"slots but q/k have {sq}/{sk}")


def available() -> bool:
  """Whether this kernel can run here: the Pallas/Triton modules imported, so yes (`nsl.nn.attention` asks every kernel)."""
  return True


def supports(q, k, v, rule: masks.Rule, q_slots, k_slots, *, block_q: int = 128, block_k: int = 128) -> bool:
  """Whether `attend` takes these shapes (`attention_impl=auto` uses the chunked path otherwise)."""
  del rule
  try:
    _check(q, k, v, q_slots, k_slots)
    _pick_block(block_q, q.shape[1], "query")
    _pick_block(block_k, k.shape[1], "key")
  except ConfigError:
    return False
  return True


def attend(q, k, v, rule: masks.Rule, q_slots, k_slots, *, block_q: int = 128, block_k: int = 128,
           interpret: bool | None = None, allow_tf32: bool = False, num_warps: int | None = None,
           num_stages: int = 2, mesh=None):
  """Block-sparse flash attention: see the module docstring. Slots are `nsl.nn.attention.Slots`."""
  _check(q, k, v, q_slots, k_slots)
  b, sq, h, d = q.shape
  sk = k.shape[1]
  if interpret is None:
    interpret = not _on_gpu()
  fp32 = q.dtype == jnp.float32
  plan = _Plan(rule, q_slots.layout, k_slots.layout, _pick_block(block_q, sq, "query"),
               _pick_block(block_k, sk, "key"), bool(interpret),
               lax.Precision.HIGHEST if fp32 and not allow_tf32 else None,
               num_warps or (4 if d <= 64 else 8), num_stages)
  dyn = dynamic_fields(rule, q_slots, k_slots, b)
  local = lambda q, k, v, dyn: _flash(plan, q, k, v, *dyn)
  mesh = context_mesh(mesh)
  if mesh is None:
    return local(q, k, v, dyn)
  return shard_over_mesh(local, mesh, q, k, v, dyn)


def dynamic_fields(rule: masks.Rule, q_slots, k_slots, batch: int) -> tuple[dict, dict]:
  """The dynamic fields the rule reads and both sides carry, as [B, S] int32 arrays.

  As in `nsl.nn.masks.visible`, a field missing on either side is not applied.
  """
  dyn_q, dyn_k = {}, {}
  for name in rule.dynamic_fields:
    a, c = getattr(q_slots, name), getattr(k_slots, name)
    if a is None or c is None:
      continue
    a, c = jnp.asarray(a, jnp.int32), jnp.asarray(c, jnp.int32)
    dyn_q[name] = jnp.broadcast_to(a, (batch, a.shape[-1]))
    dyn_k[name] = jnp.broadcast_to(c, (batch, c.shape[-1]))
  return dyn_q, dyn_k


# ----------------------------------------------------------------------------- kernels


def _select_entry(index_row, t):
  """index_row[t] for a dynamic t, as an iota-compare-sum (no scalar gather needed)."""
  hit = lax.broadcasted_iota(jnp.int32, index_row.shape, 0) == t
  return jnp.sum(jnp.where(hit, index_row, 0))


def _tile_visible(rule, q_meta, k_meta):
  vis = masks.visible(rule, q_meta, k_meta)
  return None if vis is True else vis


def _scores(plan, q, k, q_meta, k_meta, scale):
  s = plgpu.dot(q, k, trans_b=True, precision=plan.precision) * scale
  vis = _tile_visible(plan.rule, q_meta, k_meta)
  return s, vis


def _split_refs(refs, names):
  out = {}
  for n in names:
    out[n], refs = refs[0], refs[1:]
  return out, refs


def _meta_refs(refs, static, dyn):
  """The slot-metadata refs each kernel takes after its arrays: q's and k's static fields, then
  q's and k's per-call ones; returns (qs, ks, qd, kd, the kernel's output refs)."""
  qs_refs, refs = _split_refs(refs, static)
  ks_refs, refs = _split_refs(refs, static)
  qd_refs, refs = _split_refs(refs, dyn)
  kd_refs, refs = _split_refs(refs, dyn)
  return qs_refs, ks_refs, qd_refs, kd_refs, refs


def _fwd_kernel(index_ref, q_ref, k_ref, v_ref, *refs, plan: _Plan, dyn_names, scale):
  static, dyn = plan.static_fields, dyn_names
  qs_refs, ks_refs, qd_refs, kd_refs, refs = _meta_refs(refs, static, dyn)
  o_ref, lse_ref = refs
  bq, bk = plan.block_q, plan.block_k

  q = q_ref[...]
  q_meta = {n: r[...][:, None] for n, r in {**qs_refs, **qd_refs}.items()}
  index_row = index_ref[...]
  count = jnp.sum((index_row >= 0).astype(jnp.int32))

  def body(t, carry):
    acc, m_prev, l_prev = carry
    j = _select_entry(index_row, t)
    ks = pl.ds(pl.multiple_of(j * bk, bk), bk)
    k_meta = {n: r[ks][None, :] for n, r in {**ks_refs, **kd_refs}.items()}
    s, vis = _scores(plan, q, k_ref[ks, :], q_meta, k_meta, scale)
    if vis is not None:
      s = jnp.where(vis, s, -jnp.inf)
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp(s - m_safe[:, None])
    corr = jnp.exp(m_prev - m_safe)
    l_new = l_prev * corr + jnp.sum(p, axis=1)
    v = v_ref[ks, :]
    acc = acc * corr[:, None] + plgpu.dot(p.astype(v.dtype), v, precision=plan.precision)
    return acc, m_new, l_new

  d = q_ref.shape[-1]
  init = (jnp.zeros((bq, d), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
          jnp.zeros((bq,), jnp.float32))
  acc, m, l = lax.fori_loop(0, count, body, init)
  empty = l == 0.0
  l_safe = jnp.where(empty, 1.0, l)
  o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(empty, -jnp.inf, m + jnp.log(l_safe))


def _dq_kernel(index_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, plan: _Plan,
               dyn_names, scale):
  static, dyn = plan.static_fields, dyn_names
  qs_refs, ks_refs, qd_refs, kd_refs, refs = _meta_refs(refs, static, dyn)
  (dq_ref,) = refs
  bq, bk = plan.block_q, plan.block_k

  q = q_ref[...]
  do = do_ref[...]
  lse = lse_ref[...]
  delta = delta_ref[...]
  q_meta = {n: r[...][:, None] for n, r in {**qs_refs, **qd_refs}.items()}
  index_row = index_ref[...]
  count = jnp.sum((index_row >= 0).astype(jnp.int32))

  def body(t, dq):
    j = _select_entry(index_row, t)
    ks = pl.ds(pl.multiple_of(j * bk, bk), bk)
    k_meta = {n: r[ks][None, :] for n, r in {**ks_refs, **kd_refs}.items()}
    k = k_ref[ks, :]
    s, vis = _scores(plan, q, k, q_meta, k_meta, scale)
    p = jnp.exp(s - lse[:, None])
    if vis is not None:
      p = jnp.where(vis, p, 0.0)
    dp = plgpu.dot(do, v_ref[ks, :], trans_b=True, precision=plan.precision)
    ds = p * (dp - delta[:, None]) * scale
    return dq + plgpu.dot(ds.astype(k.dtype), k, precision=plan.precision)

  dq = lax.fori_loop(0, count, body, jnp.zeros((bq, q_ref.shape[-1]), jnp.float32))
  dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkv_kernel(index_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, plan: _Plan,
                dyn_names, scale):
  static, dyn = plan.static_fields, dyn_names
  qs_refs, ks_refs, qd_refs, kd_refs, refs = _meta_refs(refs, static, dyn)
  dk_ref, dv_ref = refs
  bq, bk = plan.block_q, plan.block_k

  k = k_ref[...]
  v = v_ref[...]
  k_meta = {n: r[...][None, :] for n, r in {**ks_refs, **kd_refs}.items()}
  index_row = index_ref[...]
  count = jnp.sum((index_row >= 0).astype(jnp.int32))

  def body(t, carry):
    dk, dv = carry
    i = _select_entry(index_row, t)
    qsl = pl.ds(pl.multiple_of(i * bq, bq), bq)
    q = q_ref[qsl, :]
    do = do_ref[qsl, :]
    lse = lse_ref[qsl]
    delta = delta_ref[qsl]
    q_meta = {n: r[qsl][:, None] for n, r in {**qs_refs, **qd_refs}.items()}
    s, vis = _scores(plan, q, k, q_meta, k_meta, scale)
    p = jnp.exp(s - lse[:, None])
    if vis is not None:
      p = jnp.where(vis, p, 0.0)
    dv = dv + plgpu.dot(p.astype(do.dtype), do, trans_a=True, precision=plan.precision)
    dp = plgpu.dot(do, v, trans_b=True, precision=plan.precision)
    ds = p * (dp - delta[:, None]) * scale
    dk = dk + plgpu.dot(ds.astype(q.dtype), q, trans_a=True, precision=plan.precision)
    return dk, dv

  d = k_ref.shape[-1]
  zeros = jnp.zeros((bk, d), jnp.float32)
  dk, dv = lax.fori_loop(0, count, body, (zeros, zeros))
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------- pallas_call plumbing


def _compiler_params(plan):
  if plan.interpret:
    return None
  return plgpu.CompilerParams(num_warps=plan.num_warps, num_stages=plan.num_stages)


def _meta_inputs(plan, dyn_q, dyn_k, q_tiled: bool):
  """Metadata inputs and their specs. The query side is tiled (one query tile per program) when
  `q_tiled`, else the key side is (dk/dv kernel); the other side is passed whole."""
  bq, bk = plan.block_q, plan.block_k
  sq, sk = plan.q_layout.num_slots, plan.k_layout.num_slots
  arrays, specs = [], []

  def add_static(layout, tiled, block, length):
    for n in plan.static_fields:
      arrays.append(jnp.asarray(layout.fields()[n]))
      if tiled:
        specs.append(pl.BlockSpec((block,), lambda t, b, h: (t,)))
      else:
        specs.append(pl.BlockSpec((length,), lambda t, b, h: (0,)))

  def add_dynamic(dyn, tiled, block, length):
    for n in sorted(dyn):
      arrays.append(dyn[n])
      if tiled:
        specs.append(pl.BlockSpec((None, block), lambda t, b, h: (b, t)))
      else:
        specs.append(pl.BlockSpec((None, length), lambda t, b, h: (b, 0)))

  add_static(plan.q_layout, q_tiled, bq, sq)
  add_static(plan.k_layout, not q_tiled, bk, sk)
  add_dynamic(dyn_q, q_tiled, bq, sq)
  add_dynamic(dyn_k, not q_tiled, bk, sk)
  return arrays, specs


def _forward(plan: _Plan, q, k, v, dyn_q, dyn_k):
  b, sq, h, d = q.shape
  sk = k.shape[1]
  bq = plan.block_q
  tiles = plan.tiles
  nq = sq // bq
  width = tiles.kv_index.shape[1]
  dyn_names = tuple(sorted(dyn_q))
  meta, meta_specs = _meta_inputs(plan, dyn_q, dyn_k, q_tiled=True)
  kernel = functools.partial(_fwd_kernel, plan=plan, dyn_names=dyn_names, scale=1.0 / math.sqrt(d))
  out, lse = pl.pallas_call(
      kernel,
      grid=(nq, b, h),
      in_specs=[
          pl.BlockSpec((None, width), lambda i, bi, hi: (i, 0)),
          pl.BlockSpec((None, bq, None, d), lambda i, bi, hi: (bi, i, hi, 0)),
          pl.BlockSpec((None, sk, None, d), lambda i, bi, hi: (bi, 0, hi, 0)),
          pl.BlockSpec((None, sk, None, d), lambda i, bi, hi: (bi, 0, hi, 0)),
          *meta_specs,
      ],
      out_specs=[
          pl.BlockSpec((None, bq, None, d), lambda i, bi, hi: (bi, i, hi, 0)),
          pl.BlockSpec((None, None, bq), lambda i, bi, hi: (bi, hi, i)),
      ],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, sq), jnp.float32)],
      compiler_params=_compiler_params(plan),
      interpret=plan.interpret,
      name="nsl_flash_fwd",
  )(jnp.asarray(tiles.kv_index), q, k, v, *meta)
  return out, lse


def _backward(plan: _Plan, q, k, v, dyn_q, dyn_k, out, lse, dout, dlse):
  b, sq, h, d = q.shape
  sk = k.shape[1]
  bq, bk = plan.block_q, plan.block_k
  tiles = plan.tiles
  scale = 1.0 / math.sqrt(d)
  dyn_names = tuple(sorted(dyn_q))
  # delta_i = Σ_d dO·O − dlse_i: the softmax-Jacobian row term with the lse cotangent folded in.
  delta = jnp.einsum("bshd,bshd->bhs", dout.astype(jnp.float32), out.astype(jnp.float32)) - dlse
  dout = dout.astype(q.dtype)

  meta, meta_specs = _meta_inputs(plan, dyn_q, dyn_k, q_tiled=True)
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, plan=plan, dyn_names=dyn_names, scale=scale),
      grid=(sq // bq, b, h),
      in_specs=[
          pl.BlockSpec((None, tiles.kv_index.shape[1]), lambda i, bi, hi: (i, 0)),
          pl.BlockSpec((None, bq, None, d), lambda i, bi, hi: (bi, i, hi, 0)),
          pl.BlockSpec((None, sk, None, d), lambda i, bi, hi: (bi, 0, hi, 0)),
          pl.BlockSpec((None, sk, None, d), lambda i, bi, hi: (bi, 0, hi, 0)),
          pl.BlockSpec((None, bq, None, d), lambda i, bi, hi: (bi, i, hi, 0)),
          pl.BlockSpec((None, None, bq), lambda i, bi, hi: (bi, hi, i)),
          pl.BlockSpec((None, None, bq), lambda i, bi, hi: (bi, hi, i)),
          *meta_specs,
      ],
      out_specs=pl.BlockSpec((None, bq, None, d), lambda i, bi, hi: (bi, i, hi, 0)),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=_compiler_params(plan),
      interpret=plan.interpret,
      name="nsl_flash_bwd_dq",
  )(jnp.asarray(tiles.kv_index), q, k, v, dout, lse, delta, *meta)

  meta, meta_specs = _meta_inputs(plan, dyn_q, dyn_k, q_tiled=False)
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, plan=plan, dyn_names=dyn_names, scale=scale),
      grid=(sk // bk, b, h),
      in_specs=[
          pl.BlockSpec((None, tiles.q_index.shape[1]), lambda j, bi, hi: (j, 0)),
          pl.BlockSpec((None, sq, None, d), lambda j, bi, hi: (bi, 0, hi, 0)),
          pl.BlockSpec((None, bk, None, d), lambda j, bi, hi: (bi, j, hi, 0)),
          pl.BlockSpec((None, bk, None, d), lambda j, bi, hi: (bi, j, hi, 0)),
          pl.BlockSpec((None, sq, None, d), lambda j, bi, hi: (bi, 0, hi, 0)),
          pl.BlockSpec((None, None, sq), lambda j, bi, hi: (bi, hi, 0)),
          pl.BlockSpec((None, None, sq), lambda j, bi, hi: (bi, hi, 0)),
          *meta_specs,
      ],
      out_specs=[pl.BlockSpec((None, bk, None, d), lambda j, bi, hi: (bi, j, hi, 0))] * 2,
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      compiler_params=_compiler_params(plan),
      interpret=plan.interpret,
      name="nsl_flash_bwd_dkv",
  )(jnp.asarray(tiles.q_index), q, k, v, dout, lse, delta, *meta)
  return dq, dk, dv


_flash = attention_with_vjp(_forward, _backward)
