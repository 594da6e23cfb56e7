"""The LR schedule as a runtime argument of the train step (nsl.train.state.Schedule): the same
LRs, bit for bit, as the optax schedule earlier versions compiled in as constants, the same
training, and one train-step program for every budget and LR of one model."""

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nsl.models.transformer import StandardFamily
from nsl.train import program as program_lib
from nsl.train import state as train_state
from nsl.train import step as train_step_lib
from tests.helpers import tiny_config


def previous_schedule(config) -> optax.Schedule:
  """nsl.train.state.lr_schedule before the schedule became an argument (git d865488), verbatim:
  the reference every LR below is compared with."""
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


def _config(schedule="wsd", steps=6, warmup=2, decay=2, lr=3e-3, ratio=0.1, **overrides):
  c = tiny_config("unused", **overrides)  # no data is read: schedules, optimizers and lowering only
  t = c.train
  t.schedule, t.steps, t.warmup_steps, t.decay_steps, t.lr, t.min_lr_ratio = schedule, steps, warmup, decay, lr, ratio
  return c


# (steps, warmup, decay): with and without warmup, no decay, no constant phase (steps = W + D), a
# horizon whose 1/T and π/T round differently from π·(1/T) in float32 (963, 7)
SHAPES = [(40, 5, 10), (40, 0, 10), (40, 5, 0), (15, 5, 10), (7, 0, 0), (1000, 37, 333)]
CASES = list(itertools.product(("wsd", "cosine"), SHAPES, ((3e-3, 0.1), (0.7, 0.0))))


def test_the_lr_at_every_step_is_the_previous_schedules_bit_for_bit():
  """As the step compiles it: a scalar count through jit (XLA folds the old constant divisors
  into reciprocals; `schedule_args` carries those reciprocals). The kind and, for cosine, the
  ratio are static; the rest is an argument.

  Bit-equal at XLA's default LLVM optimisation (what runs use). The suite compiles with it off
  (tests/conftest.py), and there LLVM fuses a multiply-add into an FMA only where an operand is a
  constant, so the old schedule alone can differ there by the rounding of one product (at most
  an ulp of the peak LR); through the whole train step the runs stay bit-equal
  (test_a_short_run_trains_as_the_previous_step)."""
  for level, exact in ((3, True), (0, False)):
    opts = {"xla_backend_optimization_level": level}
    new = jax.jit(lambda s, n, kind, ratio: train_state.lr_fn(_config(kind, ratio=ratio), s)(n),
                  static_argnums=(2, 3), compiler_options=opts)
    for kind, (steps, w, d), (lr, ratio) in CASES:
      c = _config(kind, steps, w, d, lr, ratio)
      old = jax.jit(previous_schedule(c), compiler_options=opts)
      s = train_state.schedule_args(c)
      counts = range(steps + 1) if steps < 100 else range(0, steps + 1, 7)
      want = np.array([old(jnp.int32(i)) for i in counts])
      got = np.array([new(s, jnp.int32(i), kind, ratio) for i in counts])
      assert want.dtype == got.dtype == np.float32
      err = np.abs(want - got) / (1 if exact else np.spacing(np.float32(lr)))  # O0: in ulps of the peak
      i = err.argmax()
      assert err[i] <= (0 if exact else 1), (level, kind, steps, w, d, lr, ratio, list(counts)[i], want[i], got[i])


def _toy_params():
  rng = np.random.default_rng(0)
  return {"w": jnp.asarray(rng.normal(size=(8, 4)), jnp.float32), "g": jnp.asarray(rng.normal(size=(4,)), jnp.float32)}


@pytest.mark.parametrize("kind", ["wsd", "cosine"])
def test_the_optimizer_steps_as_the_previous_one_and_keeps_its_state(kind):
  """The whole chain (clip, AdamW with decoupled decay, the schedule's own step count) over a
  run, against the previous optimizer with the schedule compiled in: identical updates; and the
  state's tree (what checkpoints hold) is the previous one's."""
  c = _config(kind, steps=12, warmup=3, decay=4)
  t = c.train
  previous = optax.chain(optax.clip_by_global_norm(t.clip_norm),
                         optax.adamw(previous_schedule(c), b1=t.b1, b2=t.b2, eps=t.eps,
                                     weight_decay=t.weight_decay, mask=train_state._decay_mask))
  params = _toy_params()
  old_state = previous.init(params)
  new_state = train_state.make_optimizer(c).init(params)
  assert jax.tree.structure(old_state) == jax.tree.structure(new_state)

  @jax.jit
  def old_step(p, o, g):
    u, o = previous.update(g, o, p)
    return optax.apply_updates(p, u), o

  @jax.jit
  def new_step(p, o, g, s):
    u, o = train_state.make_optimizer(c, train_state.lr_fn(c, s)).update(g, o, p)
    return optax.apply_updates(p, u), o

  s, rng = train_state.schedule_args(c), np.random.default_rng(1)
  old_p, new_p, new_o = params, params, new_state
  for _ in range(t.steps + 1):
    g = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
    old_p, old_state = old_step(old_p, old_state, g)
    new_p, new_o = new_step(new_p, new_o, g, s)
    for a, b in zip(jax.tree.leaves((old_p, old_state)), jax.tree.leaves((new_p, new_o))):
      np.testing.assert_array_equal(a, b)


def test_a_short_run_trains_as_the_previous_step(monkeypatch):
  """Eight steps of the tiny model through the new step and through the previous one (its
  optimizer and logged LR rebuilt from the verbatim optax schedule): the same losses, LRs and
  parameters, bit for bit."""
  c = _config("wsd", steps=8, warmup=2, decay=3)
  family = StandardFamily(c)
  state = train_state.create(nn.unbox(family.init(jax.random.PRNGKey(0))), train_state.make_optimizer(c))
  rng = np.random.default_rng(0)
  batches = [{"tokens": jnp.asarray(rng.integers(1, 257, size=(8, 65)), jnp.int32),
              "segment": jnp.ones((8, 65), jnp.int32)}] * c.train.steps  # one batch: the loss falls

  def run(step, state):
    out = []
    for batch in batches:
      state, m = step(state, batch, jax.random.PRNGKey(1), train_state.schedule_args(c))
      out.append((float(m["loss"]), float(m["lr"])))
    return out, jax.tree.map(np.asarray, state.params)

  new = run(jax.jit(train_step_lib.make_train_step(family, c, 1)), state)
  previous_optimizer = train_state.make_optimizer
  monkeypatch.setattr(train_state, "lr_fn", lambda config, s: previous_schedule(config))
  monkeypatch.setattr(train_state, "make_optimizer",
                      lambda config, lr=None: previous_optimizer(config, previous_schedule(config)))
  old = run(jax.jit(train_step_lib.make_train_step(family, c, 1)), state)
  assert new[0] == old[0]
  assert new[0][-1][0] < new[0][0][0] and new[0][3][1] == pytest.approx(3e-3)  # it trained, at the peak
  for a, b in zip(jax.tree.leaves(new[1]), jax.tree.leaves(old[1])):
    np.testing.assert_array_equal(a, b)


def test_after_skipped_steps_the_lr_applied_is_the_step_counters_and_the_one_logged():
  """A state whose counter says 3 while its optimizer has applied nothing (three non-finite steps
  skipped): the update uses lr(3), as logged, not the LR of the optimizer's own count (0 in a
  warmup from 0). Adam's first update moves each norm gain by about the LR (m/√v = ±1)."""
  c = _config("wsd", steps=8, warmup=4, decay=2)
  family = StandardFamily(c)
  state = train_state.create(nn.unbox(family.init(jax.random.PRNGKey(0))), train_state.make_optimizer(c))
  state = state.replace(step=jnp.int32(3))
  batch = {"tokens": jnp.asarray(np.random.default_rng(0).integers(1, 257, size=(8, 65)), jnp.int32),
           "segment": jnp.ones((8, 65), jnp.int32)}
  step = jax.jit(train_step_lib.make_train_step(family, c, 1))
  new, m = step(state, batch, jax.random.PRNGKey(1), train_state.schedule_args(c))
  assert float(m["lr"]) == pytest.approx(3e-3 * 3 / 4)
  moved = [np.abs(np.asarray(a) - np.asarray(b)).max() for a, b, decayed in zip(
      jax.tree.leaves(new.params), jax.tree.leaves(state.params), jax.tree.leaves(train_state._decay_mask(state.params)))
      if not decayed]
  assert moved and max(moved) == pytest.approx(float(m["lr"]), rel=1e-3)


def test_budgets_and_lrs_of_one_model_lower_to_one_train_step():
  """What makes a grid's budgets of one size hit the persistent compilation cache: the same
  train-step program text for other steps, warmup, decay and peak LR; another width differs."""
  def text(**kw):
    return program_lib.Program(_config(**kw), jax.devices()).lower_train().as_text()

  base = text(steps=16)
  assert text(steps=64, warmup=4, decay=8) == base
  assert text(steps=32, lr=1e-2) == base
  assert text(steps=16, **{"model.d_model": 48, "model.d_ff": 144}) != base
  assert text(steps=16, schedule="cosine") != base  # the schedule's kind stays part of the program
