"""The Family interface: what the trainer, describe mode and the records need from a model.

A family is everything that makes an architecture differ from the standard transformer and
nothing else (DESIGN "Families share one trunk"). The trainer only calls `init`, `loss`,
`dummy_batch`, `param_counts` and `flops_per_token`; it knows nothing about any family.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from nsl.errors import ConfigError
from nsl.models.layers import Dims


class Family:
  """Base class; subclasses set `name`, `variants`, and implement `make_model` and `loss`."""

  name: str = ""
  variants: tuple[str, ...] = ()
  # Parameter names (last path component) counted as embedding parameters.
  embedding_params: tuple[str, ...] = ("embedding",)

  def __init__(self, config):
    self.config = config
    self.dims = Dims.from_config(config)
    self.model = self.make_model()

  @classmethod
  def validate(cls, config) -> None:
    if cls.variants and config.model.variant not in cls.variants:
      raise ConfigError(f"config.model.variant={config.model.variant!r} is not a variant of family "
                        f"{cls.name!r}; choose one of {cls.variants}")

  # -- to implement -----------------------------------------------------------------------------
  def make_model(self) -> nn.Module:
    raise NotImplementedError

  def model_inputs(self, batch: dict[str, Any]) -> tuple:
    """Positional arguments of `model.apply` for initialisation from a batch."""
    raise NotImplementedError

  def loss(self, params, batch: dict[str, Any], rng, step) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(mean loss, metrics); metrics must include `weight`, the number of targets averaged."""
    raise NotImplementedError

  def flops_per_token(self) -> float:
    raise NotImplementedError

  # -- shared -----------------------------------------------------------------------------------
  @property
  def seq_len(self) -> int:
    return int(self.config.data.seq_len)

  def dummy_batch(self, batch_size: int = 1) -> dict[str, jax.Array]:
    """A batch of the shape the data pipeline yields (extras come from families that need them)."""
    shape = (batch_size, self.seq_len + 1)
    return {"tokens": jnp.zeros(shape, jnp.int32), "segment": jnp.ones(shape, jnp.int32)}

  def init(self, rng) -> Any:
    """Parameters as a pytree of `nn.LogicallyPartitioned` boxes (unbox with `nn.unbox`)."""
    return self.model.init(rng, *self.model_inputs(self.dummy_batch()))["params"]

  def abstract_params(self):
    return jax.eval_shape(self.init, jax.random.PRNGKey(0))

  def param_counts(self, abstract_params=None) -> dict[str, int]:
    """Total, embedding and non-embedding parameter counts (from shapes; no allocation)."""
    tree = nn.unbox(abstract_params if abstract_params is not None else self.abstract_params())
    total = emb = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      n = int(np.prod(leaf.shape))
      total += n
      if getattr(path[-1], "key", None) in self.embedding_params:
        emb += n
    return {"params_total": total, "params_embedding": emb, "params_non_embedding": total - emb}


def train_flops_per_token(matmul_params_per_token: float, attention_pairs_per_token: float,
                          n_layers: int, d_model: int) -> float:
  """Training FLOPs per token (REFERENCES §5 "Counting"): 6 per matmul weight used per token
  (forward 2, backward 4), plus attention: QKᵀ and AV cost 4·d FLOPs per visible (q, k) pair per
  layer forward, ×3 for training, counting only visible pairs of the mask."""
  return 6.0 * matmul_params_per_token + 12.0 * n_layers * d_model * attention_pairs_per_token
