"""nsl's kernels (attention: `splash` on TPU, `flash_gpu` and `cudnn` on GPU, `flash_cpu` on CPU;
the CPU head and decode kernels), the registry that chooses among them (`registry`), and what they share."""

from __future__ import annotations

import jax

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
