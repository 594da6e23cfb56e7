"""The C++ CPU kernel (`nsl.kernels.flash_cpu`) against the dense reference: outputs, lse and
gradients on every rule it takes, rows that see no key, sharding, and the dispatch around it.

Tiles of 16 on 64 slots give 4 x 4 tile grids, so empty tiles are skipped and partial ones masked;
the documents of `kernel_cases` make FULL tiles straddle document boundaries (masked per element)
and put whole tiles in different documents (skipped).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernel_cases as kc
from nsl.nn import attention
from nsl.errors import ConfigError
from nsl.kernels import cpu_build, flash_cpu

NUM_TOKENS = 32  # 64 slots
CASES = {c.name: c for c in kc.make_cases(NUM_TOKENS) if c.rule.block is None}
RTOL = 2e-5  # float32 throughout; the dense reference sums in another order


def _kernel(case, block_q=16, block_k=16):
  return lambda q, k, v: flash_cpu.attend(q, k, v, case.rule, case.q_slots, case.k_slots,
                                          block_q=block_q, block_k=block_k)


@pytest.fixture(scope="module", autouse=True)
def _built():
  if not flash_cpu.available():
    pytest.fail(f"the CPU kernel did not build: {cpu_build.load()}")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_dense(name):
  kc.check_against_dense(CASES[name], _kernel(CASES[name]), head_dim=32, rtol=RTOL)


def test_rectangular_tiles_wide_heads_and_one_tile():
  case = CASES["sps_stream_major"]
  kc.check_against_dense(case, _kernel(case, block_q=32, block_k=16), head_dim=64, rtol=RTOL)
  kc.check_against_dense(case, _kernel(case, block_q=64, block_k=64), head_dim=16, rtol=RTOL)


def test_rows_that_see_no_key_get_zeros_and_minus_inf():
  """Keys of document 2 relabelled: its queries see nothing (out 0, lse -inf, no gradient)."""
  case = CASES["causal"]
  seg = np.asarray(case.q_slots.segment)
  k_seg = np.where(seg == 2, 99, seg)
  k_slots = attention.Slots(case.k_slots.layout, segment=jnp.asarray(k_seg))
  odd = kc.Case("no_key_rows", case.rule, case.q_slots, k_slots)
  lse = kc.check_against_dense(odd, _kernel(odd), head_dim=16, rtol=RTOL)
  assert np.isneginf(lse).any() and np.isfinite(lse).any()


def _hlo(fn, *args):
  return jax.jit(fn).lower(*args).as_text()


def test_auto_on_cpu_runs_the_kernel_and_falls_back_where_it_cannot():
  case = CASES["sps_stream_major"]
  q, k, v = kc.qkv(case, 2, 16)
  auto = lambda q, k, v: attention.attend(q, k, v, case.rule, case.q_slots, case.k_slots)
  assert attention.resolve_impl("auto") == "flash_cpu"
  assert flash_cpu.TARGETS["fwd"] in _hlo(auto, q, k, v)
  assert flash_cpu.TARGETS["bwd"] in _hlo(jax.grad(lambda *a: jnp.sum(auto(*a)), argnums=(0, 1, 2)), q, k, v)
  # bfloat16, a head dim off the 16-grid, a block rule: the chunked XLA path, same answer
  for qq, kk, vv in ((q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)),
                     (q[..., :12], k[..., :12], v[..., :12])):
    assert flash_cpu.TARGETS["fwd"] not in _hlo(auto, qq, kk, vv)
  dd = next(c for c in kc.make_cases(NUM_TOKENS) if c.rule.block is not None)
  assert not flash_cpu.supports(q, k, v, dd.rule, dd.q_slots, dd.k_slots)


def test_explicit_choice_it_cannot_take_is_a_config_error():
  case = CASES["causal"]
  q, k, v = kc.qkv(case, 2, 16, dtype=jnp.bfloat16)
  with pytest.raises(ConfigError, match="float32 only"):
    attention.attend(q, k, v, case.rule, case.q_slots, case.k_slots, impl="flash_cpu")
  q, k, v = kc.qkv(case, 2, 8)
  with pytest.raises(ConfigError, match="multiple of 16"):
    attention.attend(q, k, v, case.rule, case.q_slots, case.k_slots, impl="flash_cpu")


def test_under_a_mesh_each_device_runs_its_shard():
  """With a mesh the kernel runs under shard_map (batch over data/fsdp, heads over tensor)."""
  case = CASES["sps_interleaved"]
  devices = np.array(jax.devices()[:4]).reshape(2, 1, 2)
  mesh = jax.sharding.Mesh(devices, ("data", "fsdp", "tensor"))
  kernel = lambda q, k, v: flash_cpu.attend(q, k, v, case.rule, case.q_slots, case.k_slots,
                                            block_q=16, block_k=16, mesh=mesh)
  kc.check_against_dense(case, kernel, head_dim=16, rtol=RTOL)
