"""`nsl.kernels.head_cpu`: the C++ head + cross-entropy equals the logits path in value and in both
gradients (row blocks, a short vocabulary chunk, zero weights, a logit scale), is what
`cross_entropy.head_cross_entropy` runs on one CPU device, and is left to the XLA scan elsewhere."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.kernels import cpu_build, head_cpu
from nsl.nn import cross_entropy


@pytest.fixture(scope="module", autouse=True)
def _built():
  if cpu_build.load() is not None:
    pytest.fail(f"the CPU kernels did not build: {cpu_build.load()}")


def _shapes():
  pw = head_cpu.panel_width()  # 16 (AVX2) or 64 (AVX-512): every shape below works for both
  return 64, 5 * 64 + (256 if pw == 16 else 0)  # d, V: with AVX2 a 256-chunk and a 64-wide tail


def _inputs(n, d, v, seed=0, zero_frac=0.2):
  k = jax.random.split(jax.random.PRNGKey(seed), 4)
  h, e = jax.random.normal(k[0], (n, d)), 0.3 * jax.random.normal(k[1], (v, d))
  t = jax.random.randint(k[2], (n,), 0, v)
  w = (jax.random.uniform(k[3], (n,)) > zero_frac).astype(jnp.float32)
  return h, e, t, w


def _logits_path(h, e, t, w, scale):
  return cross_entropy.masked_cross_entropy(scale * (h @ e.T), t, w)


@pytest.mark.parametrize("n,scale", [(7, 1.0), (256, 0.25), (600, 1.0)])
def test_equals_the_logits_path_in_value_and_gradients(n, scale):
  """7 rows: one short block; 256: one full block; 600: three blocks, the last short."""
  d, v = _shapes()
  h, e, t, w = _inputs(n, d, v)
  kern = jax.jit(jax.value_and_grad(lambda h, e: head_cpu.cross_entropy(h, e, t, w, scale)[0], (0, 1)))
  ref = jax.jit(jax.value_and_grad(lambda h, e: _logits_path(h, e, t, w, scale)[0], (0, 1)))
  (l1, (dh1, de1)), (l0, (dh0, de0)) = kern(h, e), ref(h, e)
  np.testing.assert_allclose(l1, l0, rtol=1e-5)
  np.testing.assert_allclose(dh1, dh0, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(de1, de0, rtol=1e-4, atol=1e-7)
  loss, weight = jax.jit(lambda h, e: head_cpu.cross_entropy(h, e, t, w, scale))(h, e)  # forward only
  np.testing.assert_allclose(loss, l0, rtol=1e-5)
  assert float(weight) == float(jnp.sum(w))


def test_large_logits_and_a_scaled_cotangent():
  """Logits near ±60 (the softmax must subtract its row max chunk by chunk) and a loss that is
  not the graph's end (its cotangent 3.0 scales both gradients)."""
  d, v = _shapes()
  h, e, t, w = _inputs(64, d, v, seed=1)
  e = e * 12.0
  f = lambda fn: jax.jit(jax.grad(lambda h, e: 3.0 * fn(h, e, t, w, 1.0)[0], (0, 1)))
  (dh1, de1), (dh0, de0) = f(head_cpu.cross_entropy)(h, e), f(_logits_path)(h, e)
  np.testing.assert_allclose(dh1, dh0, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(de1, de0, rtol=1e-4, atol=1e-6)


def test_no_weight_means_zero_loss_and_zero_gradients():
  d, v = _shapes()
  h, e, t, _ = _inputs(16, d, v)
  w = jnp.zeros(16)
  loss, (dh, de) = jax.value_and_grad(lambda h, e: head_cpu.cross_entropy(h, e, t, w)[0], (0, 1))(h, e)
  assert float(loss) == 0.0 and not np.any(dh) and not np.any(de)


def test_bfloat16_inputs_get_gradients_in_their_dtype():
  d, v = _shapes()
  h, e, t, w = _inputs(32, d, v)
  h, e = h.astype(jnp.bfloat16), e.astype(jnp.bfloat16)
  dh, de = jax.grad(lambda h, e: head_cpu.cross_entropy(h, e, t, w)[0], (0, 1))(h, e)
  dh0, de0 = jax.grad(lambda h, e: _logits_path(h.astype(jnp.float32), e.astype(jnp.float32), t, w, 1.0)[0], (0, 1))(h, e)
  assert dh.dtype == jnp.bfloat16 and de.dtype == jnp.bfloat16
  np.testing.assert_allclose(dh.astype(jnp.float32), dh0, rtol=2e-2, atol=1e-4)


def _runs_kernel(fn, *args) -> bool:
  return "nsl_head_cpu" in jax.jit(fn).lower(*args).as_text()


def test_layers_dispatch_to_the_kernel_where_it_applies():
  d, v = _shapes()
  h, e, t, w = _inputs(8, d, v)
  grad = lambda h, e: jax.grad(lambda h, e: cross_entropy.head_cross_entropy(h, e, t, w)[0], (0, 1))(h, e)
  assert _runs_kernel(grad, h, e)
  h2, e2, t2, w2 = _inputs(8, 12, 97)  # d and V off the panel width: the XLA scan
  assert not _runs_kernel(lambda h, e: cross_entropy.head_cross_entropy(h, e, t2, w2)[0], h2, e2)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("data",))
  if len(jax.devices()) >= 2:  # an opaque call is not partitioned: several devices keep the scan
    with jax.set_mesh(mesh):
      assert not _runs_kernel(lambda h, e: cross_entropy.head_cross_entropy(h, e, t, w)[0], h, e)


def test_a_target_outside_the_vocabulary_is_an_error():
  d, v = _shapes()
  h, e, t, w = _inputs(8, d, v)
  with pytest.raises(Exception, match="outside the vocabulary"):
    jax.block_until_ready(head_cpu.cross_entropy(h, e, t.at[3].set(v), w))
