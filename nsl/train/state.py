"""TrainState, the AdamW optimizer and the learning-rate schedule (docs/papers/sps.md#training)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer steps taken (skipped non-finite steps count too)
  params: Any
  opt_state: Any
  nonfinite_run: jax.Array  # consecutive non-finite steps so far (int32 scalar)


def lr_schedule(config) -> optax.Schedule:
  """wsd: linear warmup to the peak, constant, then linear decay over the last `decay_steps` to
  `min_lr_ratio`·peak (docs/papers/sps.md#training). cosine: warmup then cosine to `min_lr_ratio`·peak."""
  t = config.train
  peak, floor = t.lr, t.lr * t.min_lr_ratio
  warmup = optax.linear_schedule(0.0, peak, max(t.warmup_steps, 1))
  if t.schedule == "cosine":
    main = optax.cosine_decay_schedule(peak, max(t.steps - t.warmup_steps, 1), alpha=t.min_lr_ratio)
    return optax.join_schedules([warmup, main], [t.warmup_steps])
  constant_steps = t.steps - t.warmup_steps - t.decay_steps
  decay = optax.linear_schedule(peak, floor, max(t.decay_steps, 1))
  return optax.join_schedules([warmup, optax.constant_schedule(peak), decay],
                              [t.warmup_steps, t.warmup_steps + constant_steps])


def _decay_mask(params):
  """Weight decay on matrices only: norm gains stay undecayed. A scanned trunk
  (`model.scan_layers`) stacks its layers on a leading axis under `layers`, so a stacked gain is
  2-D there: the rank is counted without that axis."""
  def is_matrix(path, p):
    stacked = any(getattr(k, "key", None) == "layers" for k in path)
    return p.ndim - (1 if stacked else 0) >= 2
  return jax.tree_util.tree_map_with_path(is_matrix, params)


def make_optimizer(config) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW; under μP (model.mup_base_width) each hidden matrix's
  update (its LR, and so its LR-coupled weight decay) is then scaled by 1/m
  (`nsl.nn.mup.scale_by_width`). Without μP the chain is exactly clip + AdamW."""
  from nsl.nn import mup

  t = config.train
  clip = [optax.clip_by_global_norm(t.clip_norm)] if t.clip_norm is not None else []  # None: no clipping
  mult = mup.width_mult(config)
  width = [mup.scale_by_width(mult)] if mult is not None else []
  return optax.chain(
      *clip,
      optax.adamw(lr_schedule(config), b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay,
                  mask=_decay_mask),
      *width,
  )


def create(params, optimizer: optax.GradientTransformation) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                    nonfinite_run=jnp.zeros((), jnp.int32))
