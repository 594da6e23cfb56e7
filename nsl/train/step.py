"""train_step / eval_step built from a Family's loss. The trainer knows nothing about families.

Gradient accumulation splits the global batch into `grad_accum` micro-batches scanned in order;
each micro-batch gradient is weighted by its number of targets, so the update equals the one of
the whole batch at once (token-weighted mean). A non-finite loss or gradient norm skips the
update (parameters and optimizer state unchanged), is counted in the metrics, and extends
`nonfinite_run`; the step counter advances either way so data order, RNG and the LR schedule
stay in step.

The learning-rate schedule's step counts and LRs are an argument of the step
(`nsl.train.state.Schedule`), not constants of its program: runs that differ only in
`train.steps`, `warmup_steps`, `decay_steps` or `lr` share one compile (and its cache entry).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from nsl.train import state as train_state
from nsl.train.state import TrainState


def _split_micro(batch: dict[str, Any], accum: int) -> dict[str, Any]:
  """[B, ...] -> [accum, B/accum, ...] with micro-batch m = rows m, m + accum, ...: every
  micro-batch takes rows from every data shard, so no resharding is needed."""
  return jax.tree.map(lambda x: jnp.swapaxes(x.reshape((x.shape[0] // accum, accum) + x.shape[1:]), 0, 1), batch)


def make_train_step(family, config, grad_accum: int) -> Callable:
  """(state, batch, base_rng, schedule) -> (state, metrics), with `config`'s optimizer
  (`train_state.make_optimizer`) stepping at the LR of `schedule` (`train_state.schedule_args`)."""
  grad_fn = jax.value_and_grad(family.loss, has_aux=True)

  def micro_step(params, batch, rng, step):
    (loss, metrics), grads = grad_fn(params, batch, rng, step)
    w = metrics["weight"]
    scaled = jax.tree.map(lambda g: g * w, grads)
    weighted = {k: v * w for k, v in metrics.items() if k != "weight"}
    return scaled, loss * w, weighted, w

  def train_step(state: TrainState, batch: dict[str, Any], base_rng: jax.Array,
                 schedule: train_state.Schedule):
    lr = train_state.lr_fn(config, schedule)
    # Built inside the trace around the runtime schedule; its state's structure is the same as
    # any other schedule's, so checkpoints restore whatever schedule wrote them. The LR follows
    # the step counter, which skipped steps advance too: the LR applied is the one logged, and a
    # run's decay ends on its last step. The optimizer's own count (Adam's bias correction)
    # counts applied updates only.
    optimizer = train_state.make_optimizer(config, lambda _applied: lr(state.step))
    rng = jax.random.fold_in(base_rng, state.step)
    if grad_accum == 1:
      g_sum, loss_sum, metric_sums, w_sum = micro_step(state.params, batch, rng, state.step)
    else:
      def body(carry, xs):
        mb, i = xs
        out = micro_step(state.params, mb, jax.random.fold_in(rng, i), state.step)
        return jax.tree.map(jnp.add, carry, out), None
      micro = _split_micro(batch, grad_accum)
      first = jax.tree.map(lambda x: x[0], micro)
      shapes = jax.eval_shape(micro_step, state.params, first, rng, state.step)
      zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
      (g_sum, loss_sum, metric_sums, w_sum), _ = jax.lax.scan(
          body, zero, (micro, jnp.arange(grad_accum)))
    denom = jnp.maximum(w_sum, 1.0)
    grads = jax.tree.map(lambda g: g / denom, g_sum)
    loss = loss_sum / denom
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    new_state = TrainState(
        step=state.step + 1,
        params=keep(new_params, state.params),
        opt_state=keep(new_opt_state, state.opt_state),
        nonfinite_run=jnp.where(finite, 0, state.nonfinite_run + 1),
    )
    metrics = {k: v / denom for k, v in metric_sums.items()}
    metrics.update(loss=loss, grad_norm=grad_norm, lr=lr(state.step), nonfinite=(~finite).astype(jnp.int32),
                   targets=w_sum)
    return new_state, metrics

  return train_step


def make_eval_step(family) -> Callable:
  """(params, batch) -> (sum of per-target NLL, number of targets) for exact corpus means:
  `Family.eval_nll`, the loss's next-token cross-entropy (metric `ce` where the loss adds
  auxiliary terms), so `eval_val_nll` compares across families. A family with several logits
  views scores its `eval_view()` (LIFT: `lift.eval_feed`), logged under the key suffix
  `view_suffix(eval_view())` (eval_val_nll_feed_teacher)."""
  return lambda params, batch: family.eval_nll(params, batch)
