"""`nsl.kernels.decode_cpu`: a decode step's few-row products equal XLA's, and its cached attention in one C++ call equals
`kv_cache.attend_parts` (one softmax over the cache's visible keys and the step's own) in output
and log-sum-exp, for 1-5 queries, visibility with holes and whole invisible blocks, a cache length
that no vector divides, and queries that see nothing; and it is what `KVCache.attend` runs on one
CPU device (the compiled decode loops: tests/test_decode.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.kernels import cpu_build, decode_cpu
from nsl.nn import kv_cache


@pytest.fixture(scope="module", autouse=True)
def _built():
  if cpu_build.load() is not None:
    pytest.fail(f"the CPU kernels did not build: {cpu_build.load()}")


def _inputs(b, q, h, d, s, n, seed=0, p_visible=0.6):
  rng = np.random.default_rng(seed)
  f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  vis = rng.random((b, q, s)) < p_visible
  vis[:, :, 64:128] = False  # a whole 64-key block nobody sees: skipped, never read
  vis[0, 0] = False  # row 0's first query sees no cached key ...
  vis_n = rng.random((b, q, n)) < 0.7
  vis_n[0, 0] = False  # ... and none of the new ones: out 0, lse -inf
  vis_n[-1, -1, 0] = True
  return f(b, q, h, d), f(b, h, d, s), f(b, h, s, d), jnp.asarray(vis), f(b, n, h, d), f(b, n, h, d), jnp.asarray(vis_n)


def _reference(q, k, v, vis, k_new, v_new, vis_new):
  parts = [(k, v, vis[:, None], True), (k_new, v_new, vis_new[:, None], False)]
  return kv_cache.attend_parts(q, parts, return_lse=True)


@pytest.mark.parametrize("b,q,h,d,s,n", [(2, 1, 3, 64, 200, 1), (2, 2, 2, 32, 131, 2), (3, 5, 2, 16, 37, 5),
                                         (1, 2, 1, 16, 16, 1)])
def test_equals_attend_parts_in_output_and_lse(b, q, h, d, s, n):
  args = _inputs(b, q, h, d, s, n)
  assert decode_cpu.supports(args[0], args[1])
  out, lse = jax.jit(decode_cpu.attend)(*args)
  ref_out, ref_lse = _reference(*args)
  np.testing.assert_allclose(out, ref_out, atol=2e-6, rtol=1e-5)
  np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
  assert np.isneginf(lse[0, :, 0]).all() and not np.asarray(out[0, 0]).any()
  finite = ~np.isneginf(np.asarray(ref_lse))
  np.testing.assert_allclose(np.asarray(lse)[finite], np.asarray(ref_lse)[finite], atol=2e-6, rtol=1e-6)


def test_large_scores_stay_finite():
  """Scores of ~1e3 (the softmax subtracts each query's max before exp)."""
  q, k, v, vis, kn, vn, visn = _inputs(2, 2, 2, 16, 40, 2, seed=1)
  out, lse = decode_cpu.attend(30 * q, 30 * k, v, vis, 30 * kn, vn, visn)
  ref_out, _ = _reference(30 * q, 30 * k, v, vis, kn * 30, vn, visn)
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=1e-5)


def test_supports_only_what_the_kernel_takes():
  w = decode_cpu.vector_width()
  assert w in (8, 16)
  q, k = jnp.zeros((2, 2, 4, 64)), jnp.zeros((2, 4, 64, 10))
  assert decode_cpu.supports(q, k)
  assert not decode_cpu.supports(q.astype(jnp.bfloat16), k)  # float32 only
  assert not decode_cpu.supports(jnp.zeros((2, 2, 4, 12)), jnp.zeros((2, 4, 12, 10)))  # head dim
  assert not decode_cpu.supports(jnp.zeros((2, decode_cpu.MAX_QUERIES + 1, 4, 64)), k)  # a long step (prefill)


def test_attend_write_reads_before_it_writes():
  """`attend_write` = `attend`, then the new K/V at `write` (out of range: dropped). Entry 5 is
  visible to the queries and overwritten by the step (the ring's oldest token): its old K/V is
  what the step attends to."""
  q, k, v, vis, kn, vn, visn = _inputs(2, 2, 3, 16, 40, 2, seed=2)
  vis = vis.at[:, :, 5].set(True)
  write = jnp.asarray([5, 40], jnp.int32)  # slot 1 is not kept (index == S)
  out, lse, k2, v2 = jax.jit(decode_cpu.attend_write)(q, k, v, vis, kn, vn, visn, write)
  ref_out, ref_lse = _reference(q, k, v, vis, kn, vn, visn)
  np.testing.assert_allclose(out, ref_out, atol=2e-6, rtol=1e-5)
  np.testing.assert_allclose(k2, k.at[:, :, :, 5].set(kn[:, 0]), atol=0)  # K [B, H, Dh, S]
  np.testing.assert_allclose(v2, v.at[:, :, 5].set(vn[:, 0]), atol=0)


@pytest.mark.parametrize("m,k,n", [(1, 64, 16), (8, 512, 1536), (16, 100, 272), (32, 7, 48), (5, 130, 512),
                                   (4, 20, 320)])
def test_matmul_equals_xla(m, k, n):
  """Row groups of 6 and their tails; K split into row ranges whose partial products are summed
  (up to 4, fixed by K), not a multiple of the 32-row block; N not a multiple of the micro-kernel's panel
  (but of the vector width), and in column chunks when K is a single block (4, 20, 320)."""
  rng = np.random.default_rng(m * k)
  x, w = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((m, k), (k, n)))
  assert decode_cpu.supports_matmul(x, w)
  np.testing.assert_allclose(jax.jit(decode_cpu.matmul)(x, w), np.asarray(x) @ np.asarray(w), rtol=1e-5, atol=1e-4)


def test_matmul_gradients_are_the_products_gradients():
  rng = np.random.default_rng(3)
  x, w = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((6, 40), (40, 32)))
  f = lambda mm: lambda x, w: jnp.sum(jnp.sin(mm(x, w)))
  for a, b in zip(jax.grad(f(decode_cpu.matmul), (0, 1))(x, w), jax.grad(f(jnp.matmul), (0, 1))(x, w)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_supports_matmul_only_what_the_kernel_takes():
  x, w = jnp.zeros((8, 64)), jnp.zeros((64, 32))
  assert decode_cpu.supports_matmul(x, w)
  assert not decode_cpu.supports_matmul(jnp.zeros((decode_cpu.MAX_ROWS + 1, 64)), w)  # a training batch
  assert not decode_cpu.supports_matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
  assert not decode_cpu.supports_matmul(x, jnp.zeros((64, 36)))  # N not a multiple of the vector width
