"""cuDNN attention (`nsl.kernels.cudnn`) without a GPU: which rules it takes, and that its
translation of each rule into `jax.nn.dot_product_attention`'s arguments (is_causal,
local_window_size, the document mask) is the rule, value and gradient. The same call runs with
`implementation="xla"` here; on a GPU, `tools/gpu_check.sh` runs it on cuDNN."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernel_cases as kc
from nsl.errors import ConfigError
from nsl.kernels import cudnn
from nsl.nn import attention, masks

CASES = {c.name: c for c in kc.make_cases(32)}
EXPRESSIBLE = ("causal", "sliding_window", "sliding_window_0")


def _xla(case, mesh=None):
  return lambda q, k, v: cudnn.attend(q, k, v, case.rule, case.q_slots, case.k_slots, implementation="xla",
                                      mesh=mesh)


def _out_only(fn):
  """cuDNN returns no lse: compare outputs and their gradients (lse taken from the reference)."""
  return lambda q, k, v: (fn(q, k, v)[0], jnp.zeros(q.shape[:1] + q.shape[2:3] + q.shape[1:2]))


@pytest.mark.parametrize("name", EXPRESSIBLE)
def test_translation_matches_dense(name):
  case = CASES[name]
  q, k, v = kc.qkv(case, 2, 16)
  ref = lambda q, k, v: (kc.dense(case)(q, k, v)[0], jnp.zeros(q.shape[:1] + q.shape[2:3] + q.shape[1:2]))
  out, _, grads = kc.run(_out_only(_xla(case)), q, k, v)
  out_d, _, grads_d = kc.run(ref, q, k, v)
  kc.assert_close(out, out_d, f"{name}: out")
  for n, g, gd in zip("qkv", grads, grads_d):
    kc.assert_close(g, gd, f"{name}: d{n}")


def test_translation_under_shard_map_on_8_devices():
  case = CASES["sliding_window"]
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(2, 1, 4), ("data", "fsdp", "tensor"))
  q, k, v = kc.qkv(case, 4, 16)
  fn = _xla(case, mesh)
  assert "shard_map" in str(jax.make_jaxpr(fn)(q, k, v))
  out = jax.jit(lambda q, k, v: fn(q, k, v)[0])(q, k, v)
  kc.assert_close(out, kc.dense(case)(q, k, v)[0], "sharded out")


@pytest.mark.parametrize("name, why", [
    ("sps_interleaved", "plain token layout"), ("sps_stream_major", "plain token layout"),
    ("delayed", "plain token layout"), ("dd_self", "block ids"), ("dd_cross", "block ids"),
])
def test_rules_cudnn_cannot_express_are_refused_by_name(name, why):
  case = CASES[name]
  q, k, v = kc.qkv(case, 2, 16, dtype=jnp.bfloat16)
  assert not cudnn.supports(q, k, v, case.rule, case.q_slots, case.k_slots)
  with pytest.raises(ConfigError, match=why):
    cudnn.attend(q, k, v, case.rule, case.q_slots, case.k_slots)


def test_cudnn_limits_and_the_lse():
  case = CASES["causal"]
  args = (case.rule, case.q_slots, case.k_slots)
  bf = kc.qkv(case, 2, 16, dtype=jnp.bfloat16)
  assert cudnn.supports(*bf, *args)
  assert "dtype" in cudnn.reason(*kc.qkv(case, 2, 16), *args)
  assert "head dim" in cudnn.reason(*kc.qkv(case, 2, 12, dtype=jnp.bfloat16), *args)
  assert "log-sum-exp" in cudnn.reason(*bf, *args, need_lse=True)
  other = attention.Slots(case.k_slots.layout, segment=case.k_slots.segment + 0)
  assert "different document ids" in cudnn.reason(*bf, case.rule, case.q_slots, other)
  with pytest.raises(ConfigError, match="log-sum-exp"):
    attention.attend(*bf, *args, impl="cudnn", return_lse=True)
  lay = masks.Layout.causal(64)
  two_way = masks.Rule(causal=False, persistent_window=3)
  assert "both ways" in cudnn.reason(*bf, two_way, attention.Slots(lay), attention.Slots(lay))
  assert not cudnn.available()  # this host has no GPU: a one-line refusal, not a crash in cuDNN
  with pytest.raises(ConfigError, match="no CUDA GPU"):
    cudnn.attend(*bf, *args)
