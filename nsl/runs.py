"""A finished run directory, for anything that reads one (evaluations, teachers, benchmarks).

`load_run(WORKDIR)` reads `WORKDIR/config.json` (written by the trainer), builds the family from
the registry and restores the parameters of the latest complete Orbax checkpoint under
`WORKDIR/checkpoints` onto this process's first device.
"""

from __future__ import annotations


import jax
import ml_collections

from nsl import storage
from nsl.errors import NslError


def load_config(workdir: str) -> ml_collections.ConfigDict:
  storage.check_bucket(workdir, "--workdir")
  path = storage.join(workdir, "config.json")
  if not storage.isfile(path):
    raise NslError(f"--workdir={workdir!r}: no config.json (is it a run directory written by nsl.launch?)")
  from nsl import options

  # A run trained by an older nsl reads in today's layout (nsl.options.upgrade).
  return options.upgrade(ml_collections.ConfigDict(storage.read_json(path, "the run's config")))


def abstract_train_state(config, family):
  """The train state's shapes and dtypes (no allocation), placed on the first local device."""
  import flax.linen as nn

  from nsl.train import state as train_state

  optimizer = train_state.make_optimizer(config)
  boxed = jax.eval_shape(lambda r: train_state.create(family.init(r), optimizer), jax.random.PRNGKey(0))
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), nn.unbox(boxed))


def load_run(workdir: str, flag: str = "--workdir"):
  """(config, family, params) of a run directory's latest checkpoint; `flag` names where the
  path came from in errors (a damaged checkpoint says which argument to fix)."""
  from nsl import checkpoint
  from nsl.models import registry

  from nsl.kernels import registry as kernels

  config = load_config(workdir)
  kernels.set_default(config.model.cpu_kernels)  # what the run trained with holds for its readers
  family = registry.get_family(config)
  params, _ = checkpoint.restore_params(workdir, abstract_train_state(config, family), flag=flag)
  return config, family, params


def checkpoint_step(workdir: str) -> int | None:
  """The step of the latest complete checkpoint (the one `load_run` restores)."""
  import orbax.checkpoint as ocp

  from nsl import checkpoint

  directory = storage.join(storage.resolve(workdir), "checkpoints")
  if not storage.isdir(directory):
    return None
  with checkpoint.quiet_orbax():
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True))
  try:
    return manager.latest_step()
  finally:
    manager.close()
