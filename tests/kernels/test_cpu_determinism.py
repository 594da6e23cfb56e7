"""Every C++ CPU kernel gives the same bits for the same inputs (docs/guide/determinism.md): called
again on 2 workers (where which worker runs which task changes from call to call), and on 1, 3 and
5 workers. Values and gradients, compared bit for bit.

`NSL_CPU_THREADS` sets the workers of each call (the kernels read it per call, so one process can
compare worker counts). The shapes are small but give every kernel several tasks per worker, and
the head several vocabulary chunk groups and row blocks, so a result that depended on the schedule
would differ here (the head's per-worker gradient partials of issue #42 differed on every call).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernel_cases as kc
from nsl.kernels import cpu_build, decode_cpu, flash_cpu, head_cpu

CALLS = 3  # calls on 2 workers; the first is also the reference for the other worker counts
OTHER_WORKERS = ("1", "3", "5")


@pytest.fixture(scope="module", autouse=True)
def _built():
  if cpu_build.load() is not None:
    pytest.fail(f"the CPU kernels did not build: {cpu_build.load()}")


def _bits(tree):
  return [np.atleast_1d(np.asarray(x)).view(np.uint8).copy() for x in jax.tree.leaves(tree)]


def _assert_same_bits(fn, *args, monkeypatch):
  """fn(*args) on 2 workers CALLS times, then on OTHER_WORKERS: every leaf bit-identical."""
  monkeypatch.setenv(cpu_build.THREADS_ENV, "2")
  ref = _bits(fn(*args))
  for call in range(1, CALLS):
    for i, (a, b) in enumerate(zip(ref, _bits(fn(*args)))):
      assert np.array_equal(a, b), f"2 workers, call {call + 1}: output {i} differs from call 1"
  for workers in OTHER_WORKERS:
    monkeypatch.setenv(cpu_build.THREADS_ENV, workers)
    for i, (a, b) in enumerate(zip(ref, _bits(fn(*args)))):
      assert np.array_equal(a, b), f"{workers} workers: output {i} differs from 2 workers"


@pytest.mark.parametrize("name", ["causal", "sps_stream_major"])
def test_flash_attention_value_and_gradients(name, monkeypatch):
  """Forward (out, lse) and backward (dq, dk, dv): 8 (batch, head) tasks, documents and windows."""
  case = next(c for c in kc.make_cases(32) if c.name == name)
  q, k, v = kc.qkv(case, 4, 32)
  attend = lambda q, k, v: flash_cpu.attend(q, k, v, case.rule, case.q_slots, case.k_slots, block_q=16, block_k=16)
  ct = jax.random.normal(jax.random.PRNGKey(1), q.shape)

  def loss(q, k, v):
    out, lse = attend(q, k, v)
    return jnp.sum(out * ct) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

  _assert_same_bits(jax.jit(attend), q, k, v, monkeypatch=monkeypatch)
  _assert_same_bits(jax.jit(jax.value_and_grad(loss, (0, 1, 2))), q, k, v, monkeypatch=monkeypatch)


def test_head_cross_entropy_value_and_gradients(monkeypatch):
  """300 rows (two row blocks) over a vocabulary of 10 chunks (3 chunk groups, the last chunk short):
  the loss, dh (summed over every chunk) and dE (summed over every row)."""
  n, d, v = 300, 64, 9 * 256 + 64
  k = jax.random.split(jax.random.PRNGKey(0), 4)
  h, e = jax.random.normal(k[0], (n, d)), 0.3 * jax.random.normal(k[1], (v, d))
  t = jax.random.randint(k[2], (n,), 0, 64)  # few targets: rows share them (dE's one-hot terms)
  w = (jax.random.uniform(k[3], (n,)) > 0.2).astype(jnp.float32)
  assert head_cpu.supports(h, e)
  f = jax.jit(jax.value_and_grad(lambda h, e: head_cpu.cross_entropy(h, e, t, w, 0.5)[0], (0, 1)))
  _assert_same_bits(f, h, e, monkeypatch=monkeypatch)


def test_decode_attention_and_its_cache_write(monkeypatch):
  rng = np.random.default_rng(0)
  b, q, h, dh, s, n = 2, 2, 4, 32, 200, 2
  f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  args = (f(b, q, h, dh), f(b, h, dh, s), f(b, h, s, dh), jnp.asarray(rng.random((b, q, s)) < 0.6),
          f(b, n, h, dh), f(b, n, h, dh), jnp.asarray(rng.random((b, q, n)) < 0.7))
  assert decode_cpu.supports(args[0], args[1])
  _assert_same_bits(jax.jit(decode_cpu.attend), *args, monkeypatch=monkeypatch)
  write = jnp.asarray([5, s], jnp.int32)  # one entry kept, one past the cache
  _assert_same_bits(jax.jit(decode_cpu.attend_write), *args, write, monkeypatch=monkeypatch)


@pytest.mark.parametrize("m,k,n", [(8, 512, 1536), (16, 200, 272)])
def test_decode_matmul_value_and_gradients(m, k, n, monkeypatch):
  """K in 4 row ranges (partial products summed) whatever the workers; N in one or more column chunks."""
  rng = np.random.default_rng(m)
  x, w = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in ((m, k), (k, n)))
  assert decode_cpu.supports_matmul(x, w)
  _assert_same_bits(jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(jnp.sin(decode_cpu.matmul(x, w))), (0, 1))),
                    x, w, monkeypatch=monkeypatch)
  _assert_same_bits(jax.jit(decode_cpu.matmul), x, w, monkeypatch=monkeypatch)


def test_a_bad_thread_count_is_a_config_error(monkeypatch):
  from nsl.errors import ConfigError
  for bad in ("0", "-2", "two", "1.5"):
    monkeypatch.setenv(cpu_build.THREADS_ENV, bad)
    with pytest.raises(ConfigError, match="NSL_CPU_THREADS"):
      cpu_build.check_threads()
  monkeypatch.setenv(cpu_build.THREADS_ENV, "")  # empty: unset (the shell's `NSL_CPU_THREADS= cmd`)
  cpu_build.check_threads()
