"""What the kernels share: the mesh a kernel runs on (`context_mesh`, `one_cpu_device`), the
shard_map that runs a whole-array kernel over batch and heads (`shard_over_mesh`), the custom VJP of
a flash attention kernel's forward and backward calls (`attention_with_vjp`), and that of the fused
head + cross-entropy (`head_with_forward_grads`).

The kernels' folder has no `__init__.py`: `nsl.kernels` is a namespace package, so the top-level
`kernels/` folder of a checkout never answers `import kernels` ahead of PyPI's package of that name
(docs/design.md#kernels-folder)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

BATCH_AXES = ("data", "fsdp")
HEAD_AXIS = "tensor"


def context_mesh(mesh=None):
  """`mesh`, else the context mesh (`jax.set_mesh` / `nsl.sharding.use_mesh`), else None."""
  if mesh is not None:
    return mesh
  ctx = jax.sharding.get_abstract_mesh()
  return None if ctx.empty else ctx


def one_cpu_device() -> bool:
  """The computation being traced runs on the CPU, on one device: where the C++ kernels, which
  see whole arrays and are opaque to the partitioner, may run."""
  mesh = jax.sharding.get_abstract_mesh()
  return jax.default_backend() == "cpu" and (mesh.empty or mesh.size == 1)


def shard_over_mesh(local, mesh, q, k, v, seg):
  """Runs `local(q, k, v, seg) -> (out, lse)` under shard_map: the batch over the mesh axes among
  ('data', 'fsdp') that divide it, the heads over 'tensor' when it divides the head count (a
  kernel is an opaque call to the partitioner; sequence axes are not sharded). `seg` is None or
  any pytree of [B, S] int arrays (segment / block ids), split over the batch like q."""
  P = jax.sharding.PartitionSpec
  names = dict(zip(mesh.axis_names, mesh.axis_sizes))
  batch_axes, size = [], 1
  for ax in BATCH_AXES:
    if ax in names and q.shape[0] % (size * names[ax]) == 0:
      batch_axes.append(ax)
      size *= names[ax]
  batch = tuple(batch_axes) or None
  head = HEAD_AXIS if HEAD_AXIS in names and q.shape[2] % names[HEAD_AXIS] == 0 else None
  x_spec = P(batch, None, head, None)
  seg_spec = jax.tree.map(lambda _: P(batch, None), seg)
  fn = jax.shard_map(local, mesh=mesh, in_specs=(x_spec, x_spec, x_spec, seg_spec),
                     out_specs=(x_spec, P(batch, head, None)), check_vma=False)
  return fn(q, k, v, seg)


def attention_with_vjp(forward, backward):
  """A flash attention kernel as a custom VJP, (static, q, k, v, ids_q, ids_k) -> (out [B, S, H, D],
  lse [B, H, S]), from its two calls: `forward(static, q, k, v, ids_q, ids_k) -> (out, lse)` and
  `backward(static, q, k, v, ids_q, ids_k, out, lse, dout, dlse) -> (dq, dk, dv)`, which recomputes
  the probabilities from the saved lse (FlashAttention-2's backward, docs/design.md#attention).
  `static` is hashable (the kernel's plan); the ids (segment / block ids, any pytree of integer
  arrays or None) are data, with zero cotangents. Shared by the C++ CPU and the Pallas GPU kernels."""

  @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
  def attend(static, q, k, v, ids_q, ids_k):
    return forward(static, q, k, v, ids_q, ids_k)

  def fwd(static, q, k, v, ids_q, ids_k):
    out, lse = forward(static, q, k, v, ids_q, ids_k)
    return (out, lse), (q, k, v, ids_q, ids_k, out, lse)

  def bwd(static, res, cts):
    dq, dk, dv = backward(static, *res, *cts)
    zero = lambda ids: jax.tree.map(lambda a: np.zeros(a.shape, jax.dtypes.float0), ids)
    return dq, dk, dv, zero(res[3]), zero(res[4])

  attend.defvjp(fwd, bwd)
  return attend


def head_with_forward_grads(parts):
  """The fused head + cross-entropy as a custom VJP, (h [N, D], E [V, D], targets [N], weights [N],
  scale) -> (weighted mean NLL, weight sum), from `parts(..., grads) -> (loss, weight, dL/dh,
  dL/dE)`. The gradients are formed in the forward pass, since the loss ends the graph
  (nsl/nn/cross_entropy.py), so the backward pass only scales them by the loss's cotangent;
  targets and weights are data (zero gradients). Shared by the XLA scan and the C++ CPU kernel."""

  @functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
  def head(h_ND, embedding_VD, targets_N, weights_N, scale):
    return parts(h_ND, embedding_VD, targets_N, weights_N, scale, grads=False)[:2]

  def fwd(h_ND, embedding_VD, targets_N, weights_N, scale):
    loss, weight, d_h, d_e = parts(h_ND, embedding_VD, targets_N, weights_N, scale, grads=True)
    return (loss, weight), (d_h.astype(h_ND.dtype), d_e.astype(embedding_VD.dtype), targets_N, weights_N)

  def bwd(scale, res, cts):
    d_h, d_e, targets_N, weights_N = res
    g_loss, _ = cts  # the weight sum does not depend on h or E
    return (g_loss * d_h).astype(d_h.dtype), (g_loss * d_e).astype(d_e.dtype), \
        np.zeros(targets_N.shape, jax.dtypes.float0), jnp.zeros_like(weights_N)

  head.defvjp(fwd, bwd)
  return head
