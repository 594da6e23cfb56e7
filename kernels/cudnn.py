"""GPU: cuDNN's fused flash attention (`jax.nn.dot_product_attention(implementation="cudnn")`)
for the nsl rules it can express.

`attend(q, k, v, rule, q_slots, k_slots)` -> (out [B, S, H, D] in q.dtype, lse), the contract of
`nsl.nn.attention.attend(..., impl='cudnn')`, differentiable in q, k and v through cuDNN's own
backward. What cuDNN takes (`reason` names the first obstacle, `supports` is "no obstacle"):

- the plain token layout on both sides (`masks.Layout.causal`: pos = tok = slot, every key
  persistent), self-attention (the same S on both sides);
- `causal` -> `is_causal=True`; `persistent_window=w` (causal) -> `local_window_size=(w, 0)`,
  i.e. cuDNN's sliding window of w + 1 keys ending at the query, the rule's tok(q) − tok(k) ≤ w;
- `same_segment` with document ids -> a [B, 1, S, S] boolean mask, which cuDNN applies as an
  additive bias (exact for any ids; it costs an S² bias read per head, the price of staying on
  the public API, whose packed-sequence form takes no segment ids in this JAX);
- bfloat16 / float16 inputs, a head dim that is a multiple of 8 and at most 128 (256 on Hopper),
  even lengths when a mask is present (cuDNN's own conditions).

Not expressible, so `attention_impl=auto` sends them to the Pallas kernel (`flash_gpu`): SPS's
two-kind layouts (temporary keys windowed, persistent ones not), double-decoder block ids, and
any call that needs the log-sum-exp differentiated (cuDNN's backward ignores its cotangent, so
`merge_lse` users such as the double decoder's self attention cannot use it). `lse` is returned
as NaN: `nsl.nn.attention.attend` refuses `return_lse=True` with this implementation.

Sharding as the other kernels: under a mesh the call runs in `shard_map` over the batch
('data', 'fsdp') and head ('tensor') axes (`nsl.kernels.common.shard_over_mesh`).

`implementation="xla"` runs the same `jax.nn.dot_product_attention` call on XLA instead: the
CPU tests check this module's translation of each rule (the arguments cuDNN receives) against
the dense reference, value and gradient, without a GPU. Not run on a GPU yet:
`tools/gpu_check.sh` is the prepared check (docs/guide/accelerators.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from nsl.errors import ConfigError
from nsl.kernels.common import context_mesh, shard_over_mesh
from nsl.nn import masks

DTYPES = (jnp.bfloat16, jnp.float16)


def available() -> bool:
  """Whether cuDNN attention can run here: a CUDA GPU (compute capability >= 8.0) and cuDNN."""
  try:
    from jax._src.lib import cuda_versions  # None without the CUDA plugin

    if cuda_versions is None or cuda_versions.cudnn_get_version() < 8900:
      return False
    gpus = jax.devices("gpu")
  except Exception:  # no GPU backend at all
    return False
  return bool(gpus) and _capability(gpus[0]) >= (8, 0)


def _capability(device) -> tuple[int, ...]:
  try:
    return tuple(int(x) for x in str(device.compute_capability).split("."))
  except (AttributeError, ValueError):
    return (0,)


def max_head_dim() -> int:
  """cuDNN flash attention's head-dim limit: 256 on Hopper and later, 128 before (and off GPU)."""
  try:
    return 256 if _capability(jax.devices("gpu")[0]) >= (9, 0) else 128
  except Exception:
    return 128


def _plain(layout: masks.Layout) -> bool:
  ar = np.arange(layout.num_slots)
  return bool((layout.pos == ar).all() and (layout.tok == ar).all() and (layout.kind == masks.PERSISTENT).all())


def reason(q, k, v, rule: masks.Rule, q_slots, k_slots, *, need_lse: bool = False,
           limits: bool = True) -> str | None:
  """Why cuDNN cannot run this attention as nsl defines it, or None when it can. `limits=False`
  leaves out cuDNN's dtype and head-dim conditions (the XLA translation check has none)."""
  b, sq, h, d = q.shape
  if need_lse:
    return "the log-sum-exp is needed with its gradient, which cuDNN's backward ignores"
  if rule.block is not None:
    return f"Rule(block={rule.block!r}) compares double-decoder block ids, which cuDNN has no mask for"
  if not (_plain(q_slots.layout) and _plain(k_slots.layout)):
    return "the slots are not the plain token layout (SPS's two kinds, or a permuted order)"
  if k.shape != q.shape or v.shape != q.shape:
    return f"q {q.shape}, k {k.shape}, v {v.shape}: cuDNN is used for self-attention of equal shapes"
  if rule.persistent_window is not None and not rule.causal:
    return "a window without causality looks both ways, which cuDNN's left window cannot say"
  if limits and (not any(q.dtype == t for t in DTYPES) or k.dtype != q.dtype or v.dtype != q.dtype):
    return f"dtype {q.dtype}: cuDNN flash attention takes bfloat16 or float16"
  if limits and (d % 8 or d > max_head_dim()):
    return f"head dim {d}: cuDNN takes multiples of 8 up to {max_head_dim()}"
  seg = _segments(rule, q_slots, k_slots, b)
  if seg is not None and q_slots.segment is not k_slots.segment:
    return "different document ids on the two sides could leave a row with no key (cuDNN would not zero it)"
  if seg is not None and sq % 2:
    return f"length {sq}: cuDNN takes a mask only with even lengths"
  return None


def supports(q, k, v, rule: masks.Rule, q_slots, k_slots, *, block_q: int = 0, block_k: int = 0,
             need_lse: bool = False) -> bool:
  """Whether `attend` takes this call (`attention_impl=auto` tries the Pallas kernel otherwise)."""
  del block_q, block_k  # cuDNN tiles itself
  return reason(q, k, v, rule, q_slots, k_slots, need_lse=need_lse) is None


def _segments(rule: masks.Rule, q_slots, k_slots, batch: int):
  """The document ids the rule applies, broadcast to [B, S] on both sides, or None."""
  if not rule.same_segment or q_slots.segment is None or k_slots.segment is None:
    return None
  fit = lambda a: jnp.broadcast_to(jnp.asarray(a, jnp.int32), (batch, jnp.shape(a)[-1]))
  return fit(q_slots.segment), fit(k_slots.segment)


def attend(q, k, v, rule: masks.Rule, q_slots, k_slots, *, block_q: int = 0, block_k: int = 0,
           need_lse: bool = False, mesh=None, implementation: str = "cudnn"):
  """cuDNN attention under an nsl rule (module docstring); a ConfigError names what it cannot express."""
  del block_q, block_k
  why = reason(q, k, v, rule, q_slots, k_slots, need_lse=need_lse, limits=implementation == "cudnn")
  if why is None and implementation == "cudnn" and not available():
    why = "no CUDA GPU with cuDNN (compute capability 8.0 or later) is visible"
  if why is not None:
    raise ConfigError(f"attention_impl='cudnn': {why}; use 'pallas_gpu' or 'auto'")
  seg = _segments(rule, q_slots, k_slots, q.shape[0])
  local = functools.partial(_local, rule=rule, implementation=implementation)
  mesh = context_mesh(mesh)
  if mesh is None:
    return local(q, k, v, seg)
  return shard_over_mesh(local, mesh, q, k, v, seg)


def _local(q, k, v, seg, *, rule: masks.Rule, implementation: str):
  mask = None if seg is None else (seg[0][:, None, :, None] == seg[1][:, None, None, :])
  window = None if rule.persistent_window is None else (int(rule.persistent_window), 0)
  out = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=rule.causal, local_window_size=window,
                                     implementation=implementation)
  b, s, h, _ = q.shape
  return out.astype(q.dtype), jnp.full((b, h, s), jnp.nan, jnp.float32)
