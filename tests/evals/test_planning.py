"""The planning eval's greedy decoder is the shared cached one: its continuations equal greedy
decoding that reruns the training forward per token, for a standard-trunk family (nextlat) and
for LIFT (its own states fed back); the teacher-forced per-position accuracy agrees with greedy
decoding position by position."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from nsl import config as config_lib
from nsl import decode
from nsl.evals import planning
from nsl.models import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = np.random.default_rng(0).integers(1, 64, (3, 6)).astype(np.int32)


def _family(spec):
  c = config_lib.load_config(os.path.join(ROOT, "configs", spec))
  c.model.update(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64)
  c.data.seq_len = 16
  c.nextlat.hidden = 32
  c.lift.top_k = 8
  fam = registry.get_family(c)
  params = nn.unbox(fam.init(jax.random.PRNGKey(1)))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 40.0  # sharper: no near-ties
  return fam, params


def test_nextlat_greedy_batch_equals_uncached_greedy():
  fam, params = _family("nextlat.py:nextlat_tiny")
  out = planning.greedy_batch(fam, params, PROMPTS, 5)
  ref, _ = decode.generate_uncached(fam, params, PROMPTS, 5)
  assert out.shape == (3, 5)
  np.testing.assert_array_equal(out, ref)


def test_lift_greedy_batch_feeds_back_its_own_states():
  fam, params = _family("lift.py:lift_tiny")
  out = planning.greedy_batch(fam, params, PROMPTS, 4)
  assert out.shape == (3, 4)
  logits = fam.recompute_feedback_logits(params, jnp.asarray(np.concatenate([PROMPTS, out], axis=1)))
  np.testing.assert_array_equal(out, np.argmax(np.asarray(logits)[:, PROMPTS.shape[1] - 1:-1], axis=-1))


def test_teacher_forced_accuracy_is_per_answer_position():
  fam, params = _family("nextlat.py:nextlat_tiny")
  out = planning.greedy_batch(fam, params, PROMPTS, 5)
  # Greedy answers are the teacher-forced argmaxes of their own prefixes (batches of 2 split 3 rows).
  assert planning.teacher_forced_acc(fam, params, PROMPTS, out, 2) == [1.0] * 5
  wrong = out.copy()
  wrong[0, 3] = (wrong[0, 3] + 1) % 64  # one token off: position 3 right in 2 of 3 rows
  assert planning.teacher_forced_acc(fam, params, PROMPTS, wrong, 2)[:4] == [1.0, 1.0, 1.0, 2 / 3]
