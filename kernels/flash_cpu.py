"""Block-sparse flash attention on the CPU: C++ XLA FFI kernels (`flash_cpu.cc`).

The default CPU attention (`attention_impl=auto` on a CPU mesh) wherever it applies: float32
q/k/v [B, S, H, D] with a head dim that is a multiple of 16, lengths that the 64-slot tiles (or
`model.attention_chunk`) divide, and any `nsl.nn.masks.Rule` without a block rule (causal, documents,
SPS's windowed temporary keys, the persistent window). Anything else runs the chunked XLA path.
The math and the tile skipping are `flash_cpu.cc`'s docstring; the custom VJP below calls its
backward, which recomputes the probabilities from the saved log-sum-exp (FlashAttention-2).

Why a kernel: XLA:CPU copies each key slice before a dot, and on 2 cores the chunked path was
1.11× the time of torch's fused causal SDPA at 1024 tokens (docs/benchmarks.md#current); the kernel reads
q/k/v in place and keeps a query block's scores in cache.

Built with the other CPU kernels by `nsl.kernels.cpu_build` (on first use, or by `make install`);
a host that cannot build them (no compiler) warns once on stderr and keeps the chunked path.
"""

from __future__ import annotations

import dataclasses
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from nsl.nn import masks
from nsl.errors import ConfigError
from nsl.kernels import cpu_build
from nsl.kernels.common import attention_with_vjp, context_mesh, shard_over_mesh

TILE = 64  # query and key tile: measured (docs/benchmarks.md#profiles: 64 vs 128 at 1024 causal)
TARGETS = {"fwd": "nsl_flash_cpu_fwd", "bwd": "nsl_flash_cpu_bwd"}  # registered by cpu_build


@functools.lru_cache(maxsize=None)
def available() -> bool:
  """Whether the kernel library builds and loads here; warns once (stderr) when it does not."""
  reason = cpu_build.load()
  if reason is not None:
    print(f"nsl: the CPU attention kernel is unavailable ({reason.splitlines()[0]}); "
          "attention runs the chunked XLA path", file=sys.stderr)
  return reason is None


def _pick_block(block: int, n: int) -> int | None:
  """The largest multiple of 16 that is <= block and divides n (None if there is none)."""
  b = min(block, n) // 16 * 16
  while b >= 16 and n % b:
    b -= 16
  return b if b >= 16 else None


def _check(q, k, v, rule: masks.Rule, q_slots, k_slots, block_q: int, block_k: int) -> tuple[int, int]:
  b, sq, h, d = q.shape
  if k.shape[0] != b or k.shape[2:] != (h, d) or v.shape != k.shape:
    raise ConfigError(f"flash_cpu: q {q.shape}, k {k.shape}, v {v.shape} must share batch, heads "
                      "and head dim")
  if not all(x.dtype == jnp.float32 for x in (q, k, v)):
    raise ConfigError(f"flash_cpu: float32 only (got {q.dtype}); use attention_impl='chunked'")
  if d % 16:
    raise ConfigError(f"flash_cpu: head dim {d} must be a multiple of 16; use attention_impl='chunked'")
  if rule.block is not None:
    raise ConfigError("flash_cpu: block rules (the double decoder's) are not supported; "
                      "use attention_impl='chunked'")
  if q_slots.layout.num_slots != sq or k_slots.layout.num_slots != k.shape[1]:
    raise ConfigError(f"flash_cpu: layouts have {q_slots.layout.num_slots}/{k_slots.layout.num_slots} "
                      f"slots but q/k have {sq}/{k.shape[1]}")
  bq, bk = _pick_block(block_q, sq), _pick_block(block_k, k.shape[1])
  if bq is None or bk is None:
    raise ConfigError(f"flash_cpu: lengths {sq}/{k.shape[1]} need a tile that is a multiple of 16 "
                      "and divides them; use attention_impl='chunked'")
  return bq, bk


def supports(q, k, v, rule: masks.Rule, q_slots, k_slots, *, block_q: int = TILE, block_k: int = TILE) -> bool:
  """Whether `attend` takes this attention (`attention_impl=auto` runs the chunked path otherwise)."""
  try:
    _check(q, k, v, rule, q_slots, k_slots, block_q, block_k)
  except ConfigError:
    return False
  return available()


@functools.lru_cache(maxsize=64)
def _static(rule: masks.Rule, q_layout: masks.Layout, k_layout: masks.Layout, bq: int, bk: int):
  bmap = np.asarray(masks.block_map(rule, q_layout, k_layout, bq, bk), np.int8)
  q_meta = np.stack([q_layout.pos, q_layout.tok, q_layout.kind]).astype(np.int32)
  k_meta = np.stack([k_layout.pos, k_layout.tok, k_layout.kind]).astype(np.int32)
  return bmap, q_meta, k_meta


def attend(q, k, v, rule: masks.Rule, q_slots, k_slots, *, block_q: int = TILE, block_k: int = TILE,
           mesh=None):
  """`nsl.nn.attention.attend` on the CPU kernel: out [B, Sq, H, D], lse [B, H, Sq] (float32)."""
  bq, bk = _check(q, k, v, rule, q_slots, k_slots, block_q, block_k)
  if not available():
    raise ConfigError(f"model.attention_impl='flash_cpu' is unavailable here ({cpu_build.load()}); use 'chunked'")
  b = q.shape[0]
  use_seg = rule.same_segment and q_slots.segment is not None and k_slots.segment is not None
  seg = lambda s, n: (jnp.broadcast_to(jnp.asarray(s, jnp.int32), (b, n)) if use_seg
                      else jnp.zeros((b, n), jnp.int32))
  q_seg, k_seg = seg(q_slots.segment, q.shape[1]), seg(k_slots.segment, k.shape[1])
  spec = _Spec(rule, q_slots.layout, k_slots.layout, bq, bk, use_seg)
  mesh = context_mesh(mesh)
  local = lambda q, k, v, seg: _flash(spec, q, k, v, *seg)
  if mesh is None:
    return local(q, k, v, (q_seg, k_seg))
  return shard_over_mesh(local, mesh, q, k, v, (q_seg, k_seg))


@dataclasses.dataclass(frozen=True)
class _Spec:
  """Static arguments of one attention (hashable: custom_vjp's nondiff argument)."""

  rule: masks.Rule
  q_layout: masks.Layout
  k_layout: masks.Layout
  bq: int
  bk: int
  use_seg: bool

  def operands(self):
    bmap, q_meta, k_meta = _static(self.rule, self.q_layout, self.k_layout, self.bq, self.bk)
    return jnp.asarray(q_meta), jnp.asarray(k_meta), jnp.asarray(bmap)

  def attrs(self):
    r = self.rule
    return dict(causal=np.int64(r.causal), same_segment=np.int64(self.use_seg),
                window=np.int64(-1 if r.window is None else r.window),
                persistent_window=np.int64(-1 if r.persistent_window is None else r.persistent_window),
                block_q=np.int64(self.bq), block_k=np.int64(self.bk))


def _fwd_call(spec: _Spec, q, k, v, q_seg, k_seg):
  b, sq, h, _ = q.shape
  q_meta, k_meta, bmap = spec.operands()
  call = jax.ffi.ffi_call(TARGETS["fwd"], (jax.ShapeDtypeStruct(q.shape, jnp.float32),
                                          jax.ShapeDtypeStruct((b, h, sq), jnp.float32)),
                          vmap_method="sequential")
  return call(q, k, v, q_meta, k_meta, q_seg, k_seg, bmap, **spec.attrs())


def _bwd_call(spec: _Spec, q, k, v, q_seg, k_seg, out, lse, dout, dlse):
  q_meta, k_meta, bmap = spec.operands()
  shapes = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, v))
  call = jax.ffi.ffi_call(TARGETS["bwd"], shapes, vmap_method="sequential")
  return call(q, k, v, out, lse, dout.astype(jnp.float32), dlse.astype(jnp.float32),
              q_meta, k_meta, q_seg, k_seg, bmap, **spec.attrs())


_flash = attention_with_vjp(_fwd_call, _bwd_call)
