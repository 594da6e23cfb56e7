"""`layers.dense` is the einsum it replaces (forms used by the families), values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.nn import layers

KEYS = jax.random.split(jax.random.PRNGKey(0), 2)


@pytest.mark.parametrize("x_shape,w_shape,kwargs,spec", [
    ((2, 5, 8), (8, 3, 4), {}, "bsd,dhk->bshk"),                    # q/k/v projections
    ((2, 5, 3, 4), (3, 4, 8), {"n_in": 2}, "bshk,hkd->bsd"),        # attention output
    ((2, 5, 8), (11, 8), {"transpose_w": True}, "bsd,vd->bsv"),     # the tied head
    ((7, 8), (8, 6), {}, "nd,df->nf"),                               # already 2-D
    ((2, 5, 48), (48, 4, 16), {}, "bsd,dhk->bshk"),                  # 10 rows: the CPU few-row kernel
])
def test_dense_equals_einsum(x_shape, w_shape, kwargs, spec):
  x, w = jax.random.normal(KEYS[0], x_shape), jax.random.normal(KEYS[1], w_shape)
  f = lambda x, w: jnp.sum(jnp.sin(layers.dense(x, w, **kwargs)))
  g = lambda x, w: jnp.sum(jnp.sin(jnp.einsum(spec, x, w)))
  np.testing.assert_allclose(layers.dense(x, w, **kwargs), jnp.einsum(spec, x, w), rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.grad(f, (0, 1))(x, w), jax.grad(g, (0, 1))(x, w)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_decode_steps_few_rows_run_the_cpu_kernel():
  """On one CPU device a product of at most `decode_cpu.MAX_ROWS` rows goes to
  `nsl.kernels.decode_cpu.matmul` (a decode step's projections); more rows stay XLA's dot."""
  from nsl.kernels import decode_cpu
  w = jax.random.normal(KEYS[1], (48, 64))
  hlo = lambda rows: jax.jit(layers.dense).lower(jnp.ones((rows, 48)), w).compile().as_text()
  assert decode_cpu.supports_matmul(jnp.ones((16, 48)), w)
  assert 'custom_call_target="nsl_decode_matmul_cpu"' in hlo(16)
  assert 'custom_call_target="nsl_decode_matmul_cpu"' not in hlo(decode_cpu.MAX_ROWS + 1)
