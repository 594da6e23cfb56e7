"""Splash attention (TPU) under nsl rules against the dense reference.

Runs compiled on a TPU and in Pallas interpret mode elsewhere (≈5 s per case on CPU: splash
needs tiles of 128, so these cases use 256 slots and 2 x 2 tile grids).
"""

import jax
import numpy as np
import pytest

import kernel_cases as kc
from nsl.nn import attention, masks
from nsl.errors import ConfigError
from nsl.kernels import rules, splash

INTERPRET = kc.PLATFORM != "tpu"
NUM_TOKENS = 128  # 256 slots
CASES = {c.name: c for c in kc.make_cases(NUM_TOKENS, window=5)}
SUPPORTED = [n for n in CASES if n != "dd_cross"]
# Run by default: one case per distinct mechanism (two-run layout + window, persistent window 0,
# swapped kinds, block ids folded into segment ids). The others are marked slow.
DEFAULT = ("sps_stream_major", "sliding_window_0", "delayed", "dd_self")


def _kernel(case, **kw):
  return lambda q, k, v: splash.attend(q, k, v, case.rule, case.q_slots, case.k_slots,
                                       block_q=128, block_k=128, interpret=INTERPRET, **kw)


@pytest.mark.parametrize("name", SUPPORTED)
def test_rule_mask_equals_dense_mask(name):
  """The computable mask (metadata recomputed from slot indices) is the rule's static mask."""
  case = CASES[name]
  mask = splash.RuleMask(case.rule, case.q_slots.layout, case.k_slots.layout)
  expected = masks.dense_mask(case.rule, case.q_slots.layout, case.k_slots.layout)
  np.testing.assert_array_equal(mask[:, :], np.broadcast_to(expected, mask.shape))
  assert mask == splash.RuleMask(case.rule, case.q_slots.layout, case.k_slots.layout)
  assert hash(mask) == hash(splash.RuleMask(case.rule, case.q_slots.layout, case.k_slots.layout))


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow)
                                  for n in SUPPORTED])
def test_matches_dense(name):
  kc.check_against_dense(CASES[name], _kernel(CASES[name]), head_dim=32)


@pytest.mark.slow
def test_under_shard_map_on_a_mesh():
  """With a mesh, attend runs under shard_map (batch over data/fsdp, heads over tensor)."""
  case = CASES["sps_stream_major"]
  devices = np.asarray(jax.devices()[:1]).reshape(1, 1, 1)
  mesh = jax.sharding.Mesh(devices, ("data", "fsdp", "tensor"))
  kc.check_against_dense(case, _kernel(case, mesh=mesh), head_dim=32)


def test_dd_cross_is_a_config_error():
  case = CASES["dd_cross"]
  q, k, v = kc.qkv(case, 2, 32)
  with pytest.raises(ConfigError, match="block='earlier'"):
    _kernel(case)(q, k, v)


def test_unsupported_blocks_and_layouts_raise_config_error():
  case = CASES["causal"]
  q, k, v = kc.qkv(case, 2, 32)
  with pytest.raises(ConfigError, match="multiple of 128"):
    splash.attend(q, k, v, case.rule, case.q_slots, case.k_slots, block_q=96, block_k=128)
  perm = np.random.default_rng(0).permutation(256).astype(np.int32)
  shuffled = masks.Layout(pos=perm, tok=perm, kind=np.zeros_like(perm))
  assert rules.layout_runs(shuffled) is None
  s = attention.Slots(shuffled)
  with pytest.raises(ConfigError, match="periodic-affine runs"):
    splash.attend(q, k, v, case.rule, s, s, block_q=128, block_k=128)


@pytest.mark.slow
def test_dispatch_from_nsl_attention():
  case = CASES["sps_stream_major"]
  q, k, v = kc.qkv(case, 2, 32)
  out, lse = kc.fast_jit(lambda q, k, v: attention.attend(
      q, k, v, case.rule, case.q_slots, case.k_slots, impl="splash", chunk_q=128, chunk_k=128,
      return_lse=True))(q, k, v)
  out_d, lse_d = kc.dense(case)(q, k, v)
  kc.assert_close(out, out_d, "dispatch out")
  kc.assert_close(lse, lse_d, "dispatch lse")
