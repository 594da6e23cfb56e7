"""Device mesh ('data', 'fsdp', 'tensor') and the logical-axis rules (docs/design.md#sharding).

Parameters carry logical axis names; `config.mesh.rules` maps them to mesh axes; the batch is
sharded over ('data', 'fsdp'). Everything here is derived from the config and the devices.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from nsl.errors import ConfigError

AXES = ("data", "fsdp", "tensor")


def mesh_shape(config, num_devices: int) -> tuple[int, int, int]:
  """Resolves `config.mesh.shape` (one -1 fills the remaining devices) against the devices."""
  shape = tuple(int(s) for s in config.mesh.shape)
  if len(shape) != 3:
    raise ConfigError(f"config.mesh.shape={shape} must have 3 entries for the axes {AXES}")
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ConfigError(f"config.mesh.shape={shape}: sizes must be positive, with at most one -1")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ConfigError(f"config.mesh.shape={shape} does not fit {num_devices} devices "
                        f"({num_devices} is not divisible by {known})")
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  if math.prod(shape) != num_devices:
    raise ConfigError(f"config.mesh.shape={shape} needs {math.prod(shape)} devices but {num_devices} "
                      "are available; use -1 for one axis to fill the rest")
  return shape


def data_parallel_size(config, num_devices: int) -> int:
  data, fsdp, _ = mesh_shape(config, num_devices)
  return data * fsdp


def make_mesh(config, devices=None) -> Mesh:
  devices = list(devices if devices is not None else jax.devices())
  shape = mesh_shape(config, len(devices))
  try:
    from jax.experimental import mesh_utils
    arr = mesh_utils.create_device_mesh(shape, devices=devices)
  except Exception:  # CPU and odd topologies: plain row-major order is fine
    arr = np.asarray(devices).reshape(shape)
  return Mesh(arr, AXES)


def is_compile_only(mesh: Mesh) -> bool:
  """True for the devices of a `jax.experimental.topologies` description (`nsl.compile`): they
  can be compiled for but hold no arrays."""
  return type(mesh.devices.flat[0].client).__name__ == "CompileOnlyPyClient"


def use_mesh(mesh: Mesh):
  """The one way nsl enters a mesh around traced programs (docs/design.md#sharding).

  `jax.set_mesh` sets the concrete and the abstract mesh, so Flax's logical constraints apply
  and `shard_map` kernels (splash) find the mesh. A compile-only mesh has no live devices to
  place constants on, so only its abstract mesh is set: tracing and lowering see the same axes.
  """
  if is_compile_only(mesh):
    return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)
  return jax.set_mesh(mesh)


def platform() -> str:
  """The platform traced programs are for: the context mesh's devices, else the host's backend.

  Every platform choice (attention implementation, Pallas interpret mode, `dtype=auto`) reads
  this, so a TPU compile from a CPU host (`nsl.compile`) picks what the pod would."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  name = getattr(device, "platform", None) or jax.default_backend()
  return {"cuda": "gpu", "rocm": "gpu"}.get(name, name)


def rules(config) -> tuple[tuple[str, Any], ...]:
  return tuple((name, tuple(ax) if isinstance(ax, list) else ax) for name, ax in config.mesh.rules)


def logical_sharding(abstract_tree, mesh: Mesh, config):
  """NamedShardings for a (boxed) abstract pytree from its logical axis names."""
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules(config))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles this process's slice of the global batch into global sharded arrays."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local_batch.items()}


def check_divisible(abstract_tree, shardings) -> None:
  """Every sharded dimension must divide evenly over its mesh axes: a clear error otherwise."""
  flat_shapes = jax.tree_util.tree_flatten_with_path(abstract_tree)[0]
  flat_sh = jax.tree.leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding))
  for (path, leaf), sh in zip(flat_shapes, flat_sh):
    for dim, axes in zip(leaf.shape, sh.spec):
      if axes is None:
        continue
      names = axes if isinstance(axes, tuple) else (axes,)
      size = math.prod(sh.mesh.shape[a] for a in names)
      if dim % size:
        name = "/".join(str(getattr(p, "key", getattr(p, "name", p))) for p in path)
        raise ConfigError(f"parameter {name} dimension {dim} is not divisible by mesh axes {names} of size "
                          f"{size}; change config.mesh.shape or the model size (e.g. model.vocab_size, "
                          "model.n_heads)")
