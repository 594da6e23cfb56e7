"""`cross_entropy.head_cross_entropy`: the tied head + masked cross-entropy in row chunks, equal to the
logits path in value and gradients, and (on CPU, where the trainer uses it) without a logits buffer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl import config as nsl_config
from nsl.models import registry
from nsl.nn import cross_entropy


def _logits_path(h, e, t, w, scale):
  return cross_entropy.masked_cross_entropy(scale * (h @ e.T), t, w)


@pytest.mark.parametrize("n,scale", [(2500, 1.0), (2048, 0.25), (7, 1.0)])
def test_equals_the_logits_path_in_value_and_gradients(n, scale):
  """2500 rows: three chunks of HEAD_CHUNK_ROWS, the last padded with weight-0 rows; 2048: two
  full chunks, with a μP-style logit scale; 7 rows: one chunk; zero weights among the rows."""
  k = jax.random.split(jax.random.PRNGKey(0), 4)
  v, d = 97, 16
  h, e = jax.random.normal(k[0], (n, d)), 0.3 * jax.random.normal(k[1], (v, d))
  t = jax.random.randint(k[2], (n,), 0, v)
  w = (jax.random.uniform(k[3], (n,)) > 0.2).astype(jnp.float32)
  fused = jax.jit(jax.value_and_grad(lambda h, e: cross_entropy.head_cross_entropy(h, e, t, w, scale)[0], (0, 1)))
  ref = jax.jit(jax.value_and_grad(lambda h, e: _logits_path(h, e, t, w, scale)[0], (0, 1)))
  (l1, (dh1, de1)), (l0, (dh0, de0)) = fused(h, e), ref(h, e)
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  np.testing.assert_allclose(dh1, dh0, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(de1, de0, rtol=1e-4, atol=1e-7)
  assert float(cross_entropy.head_cross_entropy(h, e, t, w, scale)[1]) == float(jnp.sum(w))


def test_no_weight_means_zero_loss_and_zero_gradients():
  h, e = jnp.ones((4, 3)), jnp.ones((5, 3))
  t, w = jnp.zeros(4, jnp.int32), jnp.zeros(4)
  loss, (dh, de) = jax.value_and_grad(lambda h, e: cross_entropy.head_cross_entropy(h, e, t, w)[0], (0, 1))(h, e)
  assert float(loss) == 0.0 and not np.any(dh) and not np.any(de)


@pytest.mark.parametrize("config", ["standard_tiny", "sps_tiny"])
def test_the_train_loss_gradient_equals_the_logits_path_and_makes_no_logits_buffer(config):
  """The family's loss (standard; SPS's read-out rows) differentiates like the CE of its token
  logits, and its compiled gradient holds no [B·T, V] or [B, T, V] float32 array (the logits
  path's does: checked too, so the search can see one)."""
  c = nsl_config.load_config(f"configs/{config}.py")
  b, t, v = 4, 512, 4160  # 2048 rows: two chunks of HEAD_CHUNK_ROWS
  c.data.tokenizer, c.data.seq_len, c.model.vocab_size = "byte", t, v
  c.model.d_model, c.model.n_layers, c.model.n_heads, c.model.d_ff = 32, 2, 2, 64
  nsl_config.validate(c)
  family = registry.get_family(c)
  params = nn.unbox(jax.jit(family.init)(jax.random.PRNGKey(1)))
  tokens = jax.random.randint(jax.random.PRNGKey(2), (b, t + 1), 1, 257)
  batch = {"tokens": tokens, "segment": jnp.ones((b, t + 1), jnp.int32).at[1, 300:].set(2)}
  step = jnp.zeros((), jnp.int32)
  loss_fn = lambda p: family.loss(p, batch, jax.random.PRNGKey(3), step)[0]

  def logits_loss(p):
    _, targets, _, weights = cross_entropy.next_token_targets(batch)
    return cross_entropy.masked_cross_entropy(family.token_logits(p, batch), targets, weights)[0]

  (l1, g1), (l0, g0) = jax.jit(jax.value_and_grad(loss_fn))(params), jax.jit(jax.value_and_grad(logits_loss))(params)
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  for a, r in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, r, rtol=2e-4, atol=1e-6)
  hlo = jax.jit(jax.grad(loss_fn)).lower(params).compile().as_text()
  ref_hlo = jax.jit(jax.grad(logits_loss)).lower(params).compile().as_text()
  for shape in (f"f32[{b * t},{v}]", f"f32[{b},{t},{v}]"):
    assert shape not in hlo
  assert f"f32[{b * t},{v}]" in ref_hlo or f"f32[{b},{t},{v}]" in ref_hlo  # the check can see one
