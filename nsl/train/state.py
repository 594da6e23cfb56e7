"""TrainState, the AdamW optimizer and the learning-rate schedule (docs/papers/sps.md#training)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer steps taken (skipped non-finite steps count too)
  params: Any
  opt_state: Any
  nonfinite_run: jax.Array  # consecutive non-finite steps so far (int32 scalar)


@flax.struct.dataclass
class Schedule:
  """The numbers of the LR schedule that differ between runs of one shape: a runtime argument of
  the train step, so a grid's budgets (and LRs) of one model compile once (docs/guide/training.md).
  Scalars; `schedule_args` computes them from the config, `lr_fn` evaluates the schedule."""
  warmup: Any       # int32: warmup steps W
  decay_start: Any  # int32: wsd: steps - decay_steps; cosine: W
  decay_len: Any    # int32 >= 1: wsd: max(decay_steps, 1); cosine: max(steps - W, 1)
  warmup_rate: Any  # float32: 1 / max(W, 1)
  decay_rate: Any   # float32: wsd: 1 / decay_len; cosine: π·(1 / decay_len)
  peak: Any         # float32: train.lr
  floor: Any        # float32: min_lr_ratio·peak, the end of the wsd decay
  drop: Any         # float32: peak - floor


def schedule_args(config) -> Schedule:
  """The runtime schedule of `config`, as host scalars.

  Bit-equal to the optax schedule that earlier versions compiled into the step with its step
  counts as constants: XLA's simplifier turned its `count / T` into `count * (1/T)` and the
  cosine's `π·count / T` into `count * (π·(1/T))`, folding the constants in float32, so the rates
  here are those float32 constants; `peak - floor` is rounded once from float64 as optax's constant was."""
  t = config.train
  peak, floor = float(t.lr), float(t.lr) * float(t.min_lr_ratio)
  inverse = lambda n: np.float32(1) / np.float32(n)  # a float32 quotient, as XLA's folding gives
  if t.schedule == "cosine":
    decay_start, decay_len = t.warmup_steps, max(t.steps - t.warmup_steps, 1)
    decay_rate = np.float32(np.pi) * inverse(decay_len)
  else:
    decay_start, decay_len = t.steps - t.decay_steps, max(t.decay_steps, 1)
    decay_rate = inverse(decay_len)
  return Schedule(warmup=np.int32(t.warmup_steps), decay_start=np.int32(decay_start),
                  decay_len=np.int32(decay_len), warmup_rate=inverse(max(t.warmup_steps, 1)),
                  decay_rate=np.float32(decay_rate), peak=np.float32(peak), floor=np.float32(floor),
                  drop=np.float32(peak - floor))


def _ramp(end, span, count, length, rate):
  """optax.linear_schedule from end + span to end over `length` steps, in its arithmetic
  (polynomial_schedule at power 1): span·(1 - clip(count, 0, length)·rate) + end, rate = 1/length."""
  return span * (1 - jnp.clip(count, 0, length).astype(jnp.float32) * rate) + end


def lr_fn(config, s: Schedule) -> optax.Schedule:
  """count -> LR. wsd: linear warmup from 0 to the peak, constant, then linear decay over the last
  `decay_steps` to `min_lr_ratio`·peak (docs/papers/sps.md#training). cosine: warmup then cosine
  to `min_lr_ratio`·peak. The operations are those of optax's join_schedules of linear, constant
  and cosine_decay schedules as XLA compiled them (`schedule_args`); only the numbers are arrays."""
  t = config.train

  def lr(count):
    out = _ramp(s.peak, -s.peak, count, jnp.maximum(s.warmup, 1), s.warmup_rate)
    if t.schedule == "cosine":
      alpha = t.min_lr_ratio
      c = jnp.minimum(count - s.decay_start, s.decay_len).astype(jnp.float32)
      cosine = 0.5 * (1 + jnp.cos(c * s.decay_rate))
      return jnp.where(count < s.warmup, out, s.peak * ((1 - alpha) * cosine + alpha))
    out = jnp.where(count < s.warmup, out, s.peak)
    return jnp.where(count < s.decay_start, out,
                     _ramp(s.floor, s.drop, count - s.decay_start, s.decay_len, s.decay_rate))
  return lr


def _decay_mask(params):
  """Weight decay on matrices only: norm gains stay undecayed. A scanned trunk
  (`model.scan_layers`) stacks its layers on a leading axis under `layers`, so a stacked gain is
  2-D there: the rank is counted without that axis."""
  def is_matrix(path, p):
    stacked = any(getattr(k, "key", None) == "layers" for k in path)
    return p.ndim - (1 if stacked else 0) >= 2
  return jax.tree_util.tree_map_with_path(is_matrix, params)


def make_optimizer(config, lr: optax.Schedule | None = None) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW; under μP (model.mup_base_width) each hidden matrix's
  update (its LR, and so its LR-coupled weight decay) is then scaled by 1/m
  (`nsl.nn.mup.scale_by_width`). Without μP the chain is exactly clip + AdamW.

  `lr`: the schedule, by default the config's own with its numbers as constants; the train step
  passes `lr_fn` of its runtime `Schedule`. The state's structure does not depend on it."""
  from nsl.nn import mup

  t = config.train
  lr = lr if lr is not None else lr_fn(config, schedule_args(config))
  clip = [optax.clip_by_global_norm(t.clip_norm)] if t.clip_norm is not None else []  # None: no clipping
  mult = mup.width_mult(config)
  width = [mup.scale_by_width(mult)] if mult is not None else []
  return optax.chain(
      *clip,
      optax.adamw(lr, b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay, mask=_decay_mask),
      *width,
  )


def create(params, optimizer: optax.GradientTransformation) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params),
                    nonfinite_run=jnp.zeros((), jnp.int32))
