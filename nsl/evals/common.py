"""Loading a finished run for evaluation, for any family.

`load_run(WORKDIR)` reads `WORKDIR/config.json` (written by the trainer), builds the family from
the registry and restores the parameters of the latest complete Orbax checkpoint under
`WORKDIR/checkpoints` onto this process's first device. `eval_batches` gives the run's
validation windows; `token_nll` the per-target NLL of any family (`Family.token_logits`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from nsl.errors import NslError


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise NslError(f"--workdir={workdir!r}: no config.json (is it a run directory written by nsl.launch?)")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


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

  config = load_config(workdir)
  family = registry.get_family(config)
  params, _ = checkpoint.restore_params(workdir, abstract_train_state(config, family), flag=flag)
  return config, family, params


def checkpoint_step(workdir: str) -> int | None:
  """The step of the latest complete checkpoint (the one `load_run` restores)."""
  import orbax.checkpoint as ocp

  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  if not os.path.isdir(directory):
    return None
  manager = ocp.CheckpointManager(directory)
  try:
    return manager.latest_step()
  finally:
    manager.close()


def eval_batches(config, batch_size: int, max_batches: int | None = None, split: str = "val"):
  """The run's evaluation windows (`nsl.data.pipeline.make_eval_batches`, in order)."""
  from nsl.data import pipeline

  path = config.data.path
  if not os.path.isdir(path):
    raise NslError(f"config.data.path={path!r} of the run does not exist here; run from the directory the "
                   "run was launched from, or prepare the data again")
  return pipeline.make_eval_batches(path, split, seq_len=config.data.seq_len, batch_size=batch_size,
                                    max_batches=max_batches)


def token_nll(family, params, batch: dict[str, Any], model=None, **feed):
  """(nll [B, T], weights [B, T]): per-target negative log-likelihood of `family.token_logits`
  (under `model`, e.g. `family.with_rule(...)`, and the family's `feed` options) and whether the
  target counts."""
  from nsl.models import layers

  _, targets, _, weights = layers.next_token_targets(batch)
  logits = family.token_logits(params, batch, model=model, **feed)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  return nll * weights, weights


def grid_runs(root: str) -> list[tuple[str, str, str]]:
  """(run dir, group, seed) of every done cell under a grid root, the group its labels but the seed."""
  from pathlib import Path

  from nsl.scaling import cells as cell_files

  out = []
  if not os.path.isdir(root):
    raise NslError(f"--root={root}: not a directory")
  for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    cell = cell_files.read_json(Path(d) / cell_files.CELL_FILE)
    if cell is None or cell_files.result_status(Path(d)) != "done":
      continue
    labels = dict(cell.get("labels", {}))
    seed = str(labels.pop("seed", "?"))
    out.append((d, "-".join(str(v) for v in labels.values()) or name, seed))
  if not out:
    raise NslError(f"--root={root}: no done grid cells there (python -m nsl.scaling.grid status --root={root})")
  return out
