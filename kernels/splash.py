"""TPU: splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`) under nsl rules.

`attend(q, k, v, rule, q_slots, k_slots)` -> (out [B, Sq, H, D] in q.dtype, lse [B, H, Sq] f32),
differentiable in q, k and v: the contract of `nsl.nn.attention.attend(..., impl='splash')`.

The mask is a splash *computable* mask (`RuleMask`, a `_ComputableMask`), so host memory stays
O(S): splash evaluates it tile by tile on the host to build its block map (EMPTY tiles skipped,
FULL tiles unmasked) and inside the kernel for PARTIAL tiles. A TPU kernel cannot gather from
per-slot tables, so pos / tok / kind are *recomputed from the slot index* with the few
periodic-affine runs of `nsl.kernels.rules.layout_runs` (causal, SPS interleaved, delayed and
stream-major layouts are one or two runs); `nsl.nn.masks.visible` is then applied to them, so the
rule is the same function every backend uses. Dynamic fields go through splash's segment ids,
which test equality only:
- `segment` -> segment ids;
- `block='same'` (double-decoder self attention) -> combined ids `segment * M + block`, M = 1 +
  max block id (equality of the pair).
- `block='earlier'` (double-decoder cross attention) is an inequality on dynamic data and cannot
  be expressed: `ConfigError`; use `attention_impl='chunked'` (or 'pallas_gpu') for that layer.

The log-sum-exp: splash returns it only with `save_residuals=True`, and that mode is not
differentiable. So this module has its own custom VJP: the forward runs splash with residuals,
the backward calls splash's dq and dk/dv kernels directly with delta = rowsum(dO·O) − dlse, which
folds the lse cotangent in (needed to merge two attentions exactly, `merge_lse`). Those two
backward functions are private splash API (checked against jax 0.10.2).
Rows with no visible key: splash leaves them at its finite mask value; they are detected from the
lse and returned as out = 0, lse = -inf, with zero gradients, like the dense reference.

Constraints (`ConfigError` otherwise): block sizes are multiples of 128 dividing the sequence
lengths (a requested block larger than the sequence uses the whole sequence); layouts must be
expressible as at most `rules.MAX_RUNS` runs.

Sharding: with a mesh (`mesh=` or the context mesh from `jax.set_mesh`), the call runs under
`shard_map` with the batch split over the mesh axes among ('data', 'fsdp') that divide it and the
heads over 'tensor' when it divides the head count; sequence axes are not sharded. Each device
runs the kernel on its local batch and heads (the mask is the same for every head).

`interpret=None` runs compiled when the context mesh is a TPU mesh (also a compile-only one, for
`nsl.compile`) and in Pallas interpret mode elsewhere (slow; CPU tests).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

from nsl import sharding
from nsl.nn import masks
from nsl.errors import ConfigError
from nsl.kernels import rules
from nsl.kernels.common import context_mesh, shard_over_mesh

LANES = 128


# ----------------------------------------------------------------------------- the mask


@dataclasses.dataclass(frozen=True)
class RuleMaskFunction:
  """`visible(rule, meta(q_index), meta(k_index))` on the static fields; hashable (a jit static)."""

  rule: masks.Rule
  q_runs: tuple[rules.Run, ...]
  k_runs: tuple[rules.Run, ...]

  def __call__(self, q_ids, kv_ids):
    select = np.where if isinstance(q_ids, np.ndarray) else jnp.where
    q = rules.eval_runs(self.q_runs, q_ids, select)
    k = rules.eval_runs(self.k_runs, kv_ids, select)
    vis = masks.visible(self.rule, q, k)
    everywhere = (q_ids * 0 + kv_ids * 0) == 0  # all-True of the broadcast shape
    return everywhere if vis is True else vis & everywhere


class RuleMask(sm._ComputableMask):  # pylint: disable=protected-access
  """A splash computable mask for the static part of an nsl rule (host memory O(S))."""

  def __init__(self, rule: masks.Rule, q_layout: masks.Layout, k_layout: masks.Layout):
    q_runs, k_runs = rules.layout_runs(q_layout), rules.layout_runs(k_layout)
    for side, runs in (("query", q_runs), ("key", k_runs)):
      if runs is None:
        raise ConfigError(
            f"splash: the {side} layout is not expressible as <= {rules.MAX_RUNS} periodic-affine runs "
            "of pos/tok/kind, which a TPU kernel needs to recompute slot metadata; use "
            "attention_impl='chunked'")
    self.fn = RuleMaskFunction(rule, q_runs, k_runs)
    super().__init__((q_layout.num_slots, k_layout.num_slots), self.fn)

  def __eq__(self, other):
    return isinstance(other, RuleMask) and self.shape == other.shape and self.fn == other.fn

  def __hash__(self):
    return hash((RuleMask, self.shape, self.fn))


# ----------------------------------------------------------------------------- kernel construction


@dataclasses.dataclass(frozen=True)
class _Spec:
  rule: masks.Rule
  q_layout: masks.Layout
  k_layout: masks.Layout
  num_heads: int
  block_q: int
  block_kv: int
  interpret: bool


@functools.lru_cache(maxsize=64)
def _kernel(spec: _Spec):
  """The splash kernel for `spec`, built on a fresh thread. Building it turns the host-side block
  map into arrays that the kernel closes over; JAX's trace and mesh contexts are thread-local,
  so a thread without them yields concrete host arrays even when the first call comes from inside
  a trace (e.g. the partial evaluation of `nn.scan`'s gradient), where `ensure_compile_time_eval`
  alone leaks tracers into the cached kernel."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    return pool.submit(_build_kernel, spec).result()


def _build_kernel(spec: _Spec):
  mask = RuleMask(spec.rule, spec.q_layout, spec.k_layout)
  bq, bk = spec.block_q, spec.block_kv
  block_sizes = sk.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq,
                              block_kv_dkv=bk, block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk)
  with jax.ensure_compile_time_eval():
    return sk.make_splash_mha(sm.MultiHeadMask([mask] * spec.num_heads), block_sizes=block_sizes,
                              head_shards=1, q_seq_shards=1, save_residuals=True,
                              interpret=spec.interpret)


def _pick_block(requested: int, length: int, what: str) -> int:
  b = min(int(requested), length)
  if b % LANES or length % b:
    raise ConfigError(
        f"splash: {what} length {length} with block {requested}: the block must be a multiple of "
        f"{LANES} that divides the length; change model.attention_chunk or use attention_impl='chunked'")
  return b


def _check(rule: masks.Rule, q, k, v, q_slots, k_slots):
  if rule.block == "earlier":
    raise ConfigError(
        "splash: Rule(block='earlier') (double-decoder cross attention) compares dynamic block ids "
        "by order, which splash segment ids cannot express; use attention_impl='chunked' or "
        "'pallas_gpu' for that attention")
  b, sq, h, d = q.shape
  if k.shape[0] != b or k.shape[2] != h or v.shape[:3] != k.shape[:3] or k.shape[3] != d:
    raise ConfigError(f"splash: q {q.shape}, k {k.shape}, v {v.shape} must share batch, heads and "
                      "q/k head dim")
  if q_slots.layout.num_slots != sq or k_slots.layout.num_slots != k.shape[1]:
    raise ConfigError(f"splash: layouts have {q_slots.layout.num_slots}/{k_slots.layout.num_slots} "
                      f"slots but q/k have {sq}/{k.shape[1]}")


def _segment_ids(rule: masks.Rule, q_slots, k_slots, batch: int):
  """Dynamic fields folded into splash segment ids ([B, Sq], [B, Sk]) or None."""
  def get(slots, name):
    a = getattr(slots, name)
    return None if a is None else jnp.asarray(a, jnp.int32)

  q_ids = k_ids = None
  if rule.same_segment and get(q_slots, "segment") is not None and get(k_slots, "segment") is not None:
    q_ids, k_ids = get(q_slots, "segment"), get(k_slots, "segment")
  if rule.block == "same" and get(q_slots, "block") is not None and get(k_slots, "block") is not None:
    qb, kb = get(q_slots, "block"), get(k_slots, "block")
    if q_ids is None:
      q_ids, k_ids = qb, kb
    else:
      m = jnp.maximum(qb.max(), kb.max()) + 1
      q_ids, k_ids = q_ids * m + qb, k_ids * m + kb
  if q_ids is None:
    return None
  return (jnp.broadcast_to(q_ids, (batch, q_ids.shape[-1])),
          jnp.broadcast_to(k_ids, (batch, k_ids.shape[-1])))


# ----------------------------------------------------------------------------- public entry


def available() -> bool:
  """Whether this kernel can run here: the Pallas TPU modules imported, so yes (`nsl.nn.attention` asks every kernel)."""
  return True


def supports(q, k, v, rule: masks.Rule, q_slots, k_slots, *, block_q: int = 512, block_k: int = 512) -> bool:
  """Whether `attend` takes this rule and these shapes: lengths in 128-lane blocks, no dynamic
  block-order rule, layouts as runs (`attention_impl=auto` uses the chunked path otherwise)."""
  try:
    _check(rule, q, k, v, q_slots, k_slots)
    _pick_block(block_q, q.shape[1], "query")
    _pick_block(block_k, k.shape[1], "key")
  except ConfigError:
    return False
  return rules.layout_runs(q_slots.layout) is not None and rules.layout_runs(k_slots.layout) is not None


def attend(q, k, v, rule: masks.Rule, q_slots, k_slots, *, block_q: int = 512, block_k: int = 512,
           interpret: bool | None = None, mesh=None):
  """Splash attention under an nsl rule: see the module docstring."""
  _check(rule, q, k, v, q_slots, k_slots)
  if interpret is None:
    interpret = sharding.platform() != "tpu"
  sq, sk_len = q.shape[1], k.shape[1]
  bq = _pick_block(block_q, sq, "query")
  bk = _pick_block(block_k, sk_len, "key")
  seg = _segment_ids(rule, q_slots, k_slots, q.shape[0])
  local = functools.partial(_local_attend, rule=rule, q_layout=q_slots.layout,
                            k_layout=k_slots.layout, block_q=bq, block_kv=bk, interpret=bool(interpret))
  mesh = context_mesh(mesh)
  if mesh is None:
    return local(q, k, v, seg)
  return shard_over_mesh(local, mesh, q, k, v, seg)


def _local_attend(q, k, v, seg, *, rule, q_layout, k_layout, block_q, block_kv, interpret):
  spec = _Spec(rule, q_layout, k_layout, q.shape[2], block_q, block_kv, interpret)
  scale = 1.0 / math.sqrt(q.shape[-1])
  to_bhsd = lambda x: jnp.transpose(x, (0, 2, 1, 3))
  qs = (q.astype(jnp.float32) * scale).astype(q.dtype)
  out, lse = _splash(spec, to_bhsd(qs), to_bhsd(k), to_bhsd(v), seg)
  return jnp.transpose(out, (0, 2, 1, 3)), lse


# ----------------------------------------------------------------------------- custom VJP


def _empty_rows(lse_raw):
  """Rows that saw no key: lse at splash's mask value (masked tiles only), -inf or NaN (none)."""
  return ~(lse_raw > 0.5 * sk.DEFAULT_MASK_VALUE)


def _fwd_batched(spec, q, k, v, seg):
  kernel = _kernel(spec)

  def one(q1, k1, v1, s1):
    ids = None if s1 is None else sk.SegmentIds(q=s1[0], kv=s1[1])
    out, (lse,) = kernel(q1, k1, v1, ids)
    return out, lse

  out, lse_raw = jax.vmap(one)(q, k, v, seg)
  empty = _empty_rows(lse_raw)
  out = jnp.where(empty[..., None], 0, out).astype(q.dtype)
  return out, lse_raw, empty


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _splash(spec, q, k, v, seg):
  out, lse_raw, empty = _fwd_batched(spec, q, k, v, seg)
  return out, jnp.where(empty, -jnp.inf, lse_raw)


def _splash_fwd(spec, q, k, v, seg):
  out, lse_raw, empty = _fwd_batched(spec, q, k, v, seg)
  lse = jnp.where(empty, -jnp.inf, lse_raw)
  return (out, lse), (q, k, v, seg, out, jnp.where(empty, 0.0, lse_raw), empty)


def _collapse(info):
  if info is None or info.partial_mask_blocks is None:
    return info
  return info._replace(partial_mask_blocks=info.partial_mask_blocks.reshape(
      -1, *info.partial_mask_blocks.shape[-2:]))


def _splash_bwd(spec, res, cts):
  q, k, v, seg, out, lse, empty = res
  dout, dlse = cts
  kernel = _kernel(spec)
  kw = kernel.kwargs
  bs = kw["block_sizes"]
  common = dict(is_mqa=False, mask_value=kw["mask_value"], attn_logits_soft_cap=None,
                q_layout=bs.q_layout, k_layout=bs.k_layout, v_layout=bs.v_layout,
                mask_function=kw["mask_function"], interpret=kw["interpret"])
  dq_info, dkv_info = _collapse(kernel.dq_mask_info), _collapse(kernel.dkv_mask_info)
  # di = Σ_d dO·O − dlse: the softmax-Jacobian row term with the lse cotangent folded in.
  di = jnp.einsum("bhsd,bhsd->bhs", out.astype(jnp.float32), dout.astype(jnp.float32))
  di = jnp.where(empty, 0.0, di - jnp.where(empty, 0.0, dlse))
  dout = dout.astype(q.dtype)

  def one(q1, k1, v1, s1, lse1, do1, di1):
    ids = None if s1 is None else sk.SegmentIds(q=s1[0], kv=s1[1])
    _, dk1, dv1 = sk._splash_attention_bwd_dkv(  # pylint: disable=protected-access
        q1, k1, v1, ids, None, lse1, do1, di1, bq=bs.block_q_dkv, bkv=bs.block_kv_dkv,
        bkv_compute=bs.block_kv_dkv_compute, mask_info=dkv_info, use_fused_bwd_kernel=False, **common)
    dq1 = sk._splash_attention_bwd_dq(  # pylint: disable=protected-access
        q1, k1, v1, ids, None, lse1, do1, di1, bq=bs.block_q_dq, bkv=bs.block_kv_dq,
        mask_info=dq_info, **common)
    return dq1, dk1, dv1

  dq, dk, dv = jax.vmap(one)(q, k, v, seg, lse, dout, di)
  zero_seg = None if seg is None else jax.tree.map(lambda a: np.zeros(a.shape, jax.dtypes.float0), seg)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), zero_seg


_splash.defvjp(_splash_fwd, _splash_bwd)
