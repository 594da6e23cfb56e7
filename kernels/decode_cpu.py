"""A decode step's kernels on the CPU, C++ XLA FFI calls (`decode_cpu.cc`).

- `attend` / `attend_write`: the cached attention of a step of up to 16 queries, which
  `nsl.nn.kv_cache.KVCache.attend` (resp. `attend_write`, a decode loop's per-layer cache:
  the step's K/V then written in place) runs on a single-device CPU computation with float32
  q/K/V and a head dim that is a multiple of the host's float vector (16 with AVX-512, 8 with
  AVX2), as the kernel registry's `decode_cpu` entries pick; `kv_cache.attend_parts` otherwise. Same math and contract: one softmax over the cache's
  visible keys and the step's own, out [B, Q, H, Dh] and lse [B, H, Q] (-inf, with out 0, where a
  query sees nothing). No gradient: decoding only.
- `matmul`: x [M, K] · w [K, N] for M ≤ 32 rows (a decode step's projections, `layers.dense`).

Why: a decode step is bound by reading memory. XLA:CPU read a layer's cache once per query (SPS's
two queries: 1.4 ms a layer at XS against 0.7 ms for the standard model's one) and the step's
weights at ~65% of the bandwidth; the kernels read each (batch row, head)'s K and V once for all
queries, skipping blocks no query sees, and stream each weight once with prefetching
(docs/guide/decoding.md#step-layout).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from nsl.kernels import cpu_build
from nsl.kernels.common import one_cpu_device

# registered by cpu_build
TARGET, WRITE_TARGET, MATMUL_TARGET = "nsl_decode_cpu", "nsl_decode_cpu_write", "nsl_decode_matmul_cpu"
MAX_QUERIES = 16  # decode_cpu.cc's kMaxQ


def available() -> bool:
  """Whether the kernel library builds and loads here (the registry's availability check)."""
  return cpu_build.load() is None


def vector_width() -> int | None:
  """The float vector width the head dim must be a multiple of; None when the kernels are unavailable."""
  return cpu_build.constant("NslDecodeCpuVectorWidth")


def _require() -> None:
  if (reason := cpu_build.load()) is not None:
    raise RuntimeError(f"the CPU decode kernels are unavailable: {reason}")


def supports(q_BQHD, k_BHDS) -> bool:
  """Whether `attend` takes this step: a CPU computation on one device, float32, 1-16 queries, a
  head dim that is a multiple of `vector_width()`."""
  if not one_cpu_device():
    return False
  if q_BQHD.dtype != jnp.float32 or k_BHDS.dtype != jnp.float32 or not 1 <= q_BQHD.shape[1] <= MAX_QUERIES:
    return False
  w = vector_width()
  return w is not None and q_BQHD.shape[-1] % w == 0


def _attend_operands(q, k, v, visible, k_new, v_new, visible_new):
  f32 = lambda x: x.astype(jnp.float32)
  return f32(q), f32(k), f32(v), visible.astype(jnp.bool_), f32(k_new), f32(v_new), visible_new.astype(jnp.bool_)


def _attend_results(q_BQHD):
  """out [B, Q, H, Dh] and lse [B, H, Q]."""
  b, nq, h, _ = q_BQHD.shape
  return (jax.ShapeDtypeStruct(q_BQHD.shape, jnp.float32), jax.ShapeDtypeStruct((b, h, nq), jnp.float32))


def attend(q_BQHD, k_BHDS, v_BHSD, visible_BQS, k_new_BNHD, v_new_BNHD, visible_new_BQN):
  """Attention of queries q over cached keys (K [B, H, Dh, S], V [B, H, S, Dh], the cache's
  head-major layout, visible where `visible_BQS`) and the step's own keys (K/V [B, N, H, Dh],
  visible where `visible_new_BQN`): -> out [B, Q, H, Dh], lse [B, H, Q] (float32)."""
  _require()
  args = _attend_operands(q_BQHD, k_BHDS, v_BHSD, visible_BQS, k_new_BNHD, v_new_BNHD, visible_new_BQN)
  return jax.ffi.ffi_call(TARGET, _attend_results(q_BQHD), vmap_method="sequential")(*args)


def attend_write(q_BQHD, k_BHDS, v_BHSD, visible_BQS, k_new_BNHD, v_new_BNHD, visible_new_BQN, write_N):
  """`attend`, and the step's K/V written into the cache at entries `write_N` [N] (out of range:
  not kept) after the reads: -> (out, lse, K, V), the cache updated in place (aliased), so a decode
  loop's per-layer buffers are read and written in one pass."""
  _require()
  args = _attend_operands(q_BQHD, k_BHDS, v_BHSD, visible_BQS, k_new_BNHD, v_new_BNHD, visible_new_BQN)
  shapes = _attend_results(q_BQHD) + (jax.ShapeDtypeStruct(k_BHDS.shape, jnp.float32),
                                      jax.ShapeDtypeStruct(v_BHSD.shape, jnp.float32))
  call = jax.ffi.ffi_call(WRITE_TARGET, shapes, vmap_method="sequential", input_output_aliases={1: 2, 2: 3})
  return call(*args, write_N.astype(jnp.int32))


MAX_ROWS = 32  # decode_cpu.cc's kMaxRows


def supports_matmul(x_MK, w_KN) -> bool:
  """Whether `matmul` takes x [M, K] · w [K, N]: a CPU computation on one device, float32, at most
  `MAX_ROWS` rows (a decode step's; XLA runs larger products), N a multiple of `vector_width()`."""
  if not one_cpu_device() or x_MK.ndim != 2 or w_KN.ndim != 2 or not 1 <= x_MK.shape[0] <= MAX_ROWS:
    return False
  if x_MK.dtype != jnp.float32 or w_KN.dtype != jnp.float32:
    return False
  vw = vector_width()
  return vw is not None and w_KN.shape[1] % vw == 0


@jax.custom_vjp
def matmul(x_MK, w_KN):
  """x [M, K] · w [K, N] in the kernel (`decode_cpu.cc`, "few-row products"): each weight read
  once, streamed with prefetching. Differentiable (XLA's products in the backward pass), although
  decoding is what uses it."""
  _require()
  call = jax.ffi.ffi_call(MATMUL_TARGET, jax.ShapeDtypeStruct((x_MK.shape[0], w_KN.shape[1]), jnp.float32),
                          vmap_method="sequential")
  return call(x_MK, w_KN)


def _matmul_fwd(x_MK, w_KN):
  return matmul(x_MK, w_KN), (x_MK, w_KN)


def _matmul_bwd(res, g_MN):
  x_MK, w_KN = res
  return g_MN @ w_KN.T, x_MK.T @ g_MN


matmul.defvjp(_matmul_fwd, _matmul_bwd)
