"""The Pallas GPU kernel against the dense reference: outputs, lse and gradients on every rule.

Runs compiled on a GPU and in Pallas interpret mode elsewhere (tiny shapes: interpret mode is
slow). Tiles of 16 on 64 slots give 4 x 4 tile grids, so empty tiles are really skipped.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernel_cases as kc
from nsl.nn import attention, masks
from nsl.errors import ConfigError
from nsl.kernels import flash_gpu, rules

INTERPRET = kc.PLATFORM != "gpu"
NUM_TOKENS = 32  # 64 slots
CASES = {c.name: c for c in kc.make_cases(NUM_TOKENS)}


def _kernel(case, block_q=16, block_k=16):
  return lambda q, k, v: flash_gpu.attend(q, k, v, case.rule, case.q_slots, case.k_slots,
                                          block_q=block_q, block_k=block_k, interpret=INTERPRET)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in kc.EXTRA else n for n in CASES])
def test_matches_dense(name):
  case = CASES[name]
  lse = kc.check_against_dense(case, _kernel(case))
  if name == "dd_cross":  # the case must really contain empty rows and sink-only rows
    assert np.isneginf(lse).any() and np.isfinite(lse).any()
    vis = np.asarray(masks.dense_mask(case.rule, case.q_slots.layout, case.k_slots.layout,
                                      case.q_slots.dynamic(), case.k_slots.dynamic()))
    sink_only = (vis.sum(-1) == 1) & vis[..., 0]
    assert sink_only.any()


def test_skips_empty_tiles_in_stream_major():
  case = CASES["sps_stream_major"]
  tiles = rules.tile_lists(case.rule, case.q_slots.layout, case.k_slots.layout, 16, 16)
  assert tiles.num_visited < tiles.block_map.size  # the case exercises skipping


def test_rectangular_tiles_and_dispatch():
  """block_q != block_k, and nsl.nn.attention.attend(impl='pallas_gpu') reaches this kernel."""
  case = CASES["sps_stream_major"]
  kc.check_against_dense(case, _kernel(case, block_q=32, block_k=16), head_dim=32)
  q, k, v = kc.qkv(case, 2, 16)
  out, lse = kc.fast_jit(lambda q, k, v: attention.attend(
      q, k, v, case.rule, case.q_slots, case.k_slots, impl="pallas_gpu", chunk_q=16, chunk_k=16,
      return_lse=True))(q, k, v)
  out_d, lse_d = kc.dense(case)(q, k, v)
  kc.assert_close(out, out_d, "dispatch out")
  kc.assert_close(lse, lse_d, "dispatch lse")


def test_merge_self_and_cross_is_one_softmax():
  """ComboAttention: merge_lse(self, cross) == one softmax over the union of both key sets,
  gradients included (this needs lse and its cotangent to be exact, -inf rows included)."""
  self_c, cross_c = CASES["dd_self"], CASES["dd_cross"]
  q, k, v = kc.qkv(self_c, 2, 16)
  k2, v2 = k[:, ::-1] * 0.5, v[:, ::-1]  # a different "context" stream for the cross keys

  def combo(q, k, v):
    o_s, l_s = _kernel(self_c)(q, k, v)
    o_c, l_c = flash_gpu.attend(q, k2, v2, cross_c.rule, cross_c.q_slots, cross_c.k_slots,
                                block_q=16, block_k=16, interpret=INTERPRET)
    return attention.merge_lse(o_s, l_s, o_c, l_c)

  def union_dense(q, k, v):
    qf, kf = self_c.q_slots.fields(), self_c.k_slots.fields()
    qm = {n: a[..., :, None] for n, a in qf.items()}
    km = {n: a[..., None, :] for n, a in kf.items()}
    vis_s = masks.visible(self_c.rule, qm, km)
    vis_c = masks.visible(cross_c.rule, qm, km)
    vis = jnp.concatenate([jnp.broadcast_to(vis_s, vis_c.shape), vis_c], axis=-1)[:, None]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, jnp.concatenate([k, k2], 1)) / np.sqrt(q.shape[-1])
    lse = jax.nn.logsumexp(jnp.where(vis, s, -jnp.inf), axis=-1)
    p = jnp.where(vis, jnp.exp(s - lse[..., None]), 0.0)
    return jnp.einsum("bhqk,bkhd->bqhd", p, jnp.concatenate([v, v2], 1)), lse

  out, lse, grads = kc.run(combo, q, k, v)
  out_d, lse_d, grads_d = kc.run(union_dense, q, k, v)
  kc.assert_close(out, out_d, "combo out")
  kc.assert_close(lse, lse_d, "combo lse")
  for name, g, gd in zip("qkv", grads, grads_d):
    kc.assert_close(g, gd, f"combo d{name}")


def test_bf16_forward():
  case = CASES["sps_stream_major"]
  q, k, v = kc.qkv(case, 2, 16, dtype=jnp.bfloat16)
  out, lse = kc.fast_jit(_kernel(case))(q, k, v)
  assert out.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
  f32 = lambda x: x.astype(jnp.float32)
  out_d, lse_d = kc.dense(case)(f32(q), f32(k), f32(v))
  np.testing.assert_allclose(np.asarray(out, np.float32), out_d, atol=3e-2)
  np.testing.assert_allclose(lse, lse_d, atol=3e-2)


@pytest.mark.parametrize("shape_change, message", [
    (dict(head_dim=24), "head dim"),
    (dict(slots=40), "power-of-two tile"),
])
def test_unsupported_shapes_raise_config_error(shape_change, message):
  slots = shape_change.get("slots", 64)
  d = shape_change.get("head_dim", 16)
  lay = masks.Layout.causal(slots)
  x = jnp.zeros((1, slots, 2, d), jnp.float32)
  with pytest.raises(ConfigError, match=message):
    flash_gpu.attend(x, x, x, masks.Rule(), attention.Slots(lay), attention.Slots(lay), interpret=True)


# ----------------------------------------------------------------------------- under shard_map

def _mesh_8():
  """8 fake CPU devices (tests/conftest.py) as data 1 x fsdp 2 x tensor 4: the batch of 2 rows
  and the 4 heads are both split."""
  devices = np.asarray(jax.devices()[:8]).reshape(1, 2, 4)
  return jax.sharding.Mesh(devices, ("data", "fsdp", "tensor"))


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in kc.EXTRA else n for n in CASES])
def test_sharded_over_batch_and_heads_matches_dense(name):
  """On 8 devices the kernel runs under shard_map (rows over fsdp, heads over tensor, the
  segment / block ids split with the rows) and equals the dense reference, gradients included."""
  case = CASES[name]
  mesh = _mesh_8()
  fn = lambda q, k, v: flash_gpu.attend(q, k, v, case.rule, case.q_slots, case.k_slots, block_q=16,
                                        block_k=16, interpret=INTERPRET, mesh=mesh)
  q, k, v = kc.qkv(case, 4, 16)
  assert "shard_map" in str(jax.make_jaxpr(fn)(q, k, v))
  kc.check_against_dense(case, fn, heads=4)


def test_context_mesh_is_used_without_mesh_argument():
  case = CASES["sps_interleaved"]
  q, k, v = kc.qkv(case, 4, 16)
  fn = lambda q, k, v: flash_gpu.attend(q, k, v, case.rule, case.q_slots, case.k_slots, block_q=16,
                                        block_k=16, interpret=INTERPRET)
  from nsl import sharding
  with sharding.use_mesh(_mesh_8()):
    jaxpr = str(jax.make_jaxpr(fn)(q, k, v))
  assert "shard_map" in jaxpr
  assert "shard_map" not in str(jax.make_jaxpr(fn)(q, k, v))


# ----------------------------------------------------------------------------- auto on a GPU mesh

@pytest.fixture
def gpu_kernels_available(monkeypatch):
  """The choice as a GPU host would make it: every kernel available (no GPU needed: the choice
  reads only the rule, the layouts, shapes and dtypes)."""
  monkeypatch.setattr(attention, "_kernel_available", lambda name: True)


@pytest.mark.parametrize("name, dtype, head_dim, need_lse, expected", [
    ("causal", jnp.bfloat16, 16, False, "cudnn"),            # the standard model, with documents
    ("sliding_window", jnp.bfloat16, 16, False, "cudnn"),    # a window
    ("sliding_window_0", jnp.float16, 16, False, "cudnn"),
    ("sps_interleaved", jnp.bfloat16, 16, False, "pallas_gpu"),   # two kinds: cuDNN cannot say it
    ("sps_stream_major", jnp.bfloat16, 16, False, "pallas_gpu"),
    ("delayed", jnp.bfloat16, 16, False, "pallas_gpu"),
    ("dd_self", jnp.bfloat16, 16, True, "pallas_gpu"),       # block ids, and merge_lse needs the lse
    ("dd_cross", jnp.bfloat16, 16, True, "pallas_gpu"),
    ("causal", jnp.bfloat16, 16, True, "pallas_gpu"),        # lse differentiated: not cuDNN
    ("causal", jnp.float32, 16, False, "pallas_gpu"),        # cuDNN flash takes 16-bit floats only
    ("causal", jnp.bfloat16, 24, False, "cudnn"),            # 24: cuDNN yes (multiple of 8)...
    ("sps_interleaved", jnp.bfloat16, 24, False, "chunked"),  # ...Triton no (power of two): chunked
    ("causal", jnp.bfloat16, 12, False, "chunked"),          # neither
])
def test_auto_on_gpu_picks_cudnn_then_the_kernel_then_chunked(gpu_kernels_available, name, dtype, head_dim,
                                                              need_lse, expected):
  case = CASES[name]
  q, k, v = kc.qkv(case, 2, head_dim, dtype=dtype)
  got = attention.auto_choice("gpu", q, k, v, case.rule, case.q_slots, case.k_slots, need_lse=need_lse)
  assert got == expected


def test_auto_follows_the_platform_and_what_is_available(gpu_kernels_available, monkeypatch):
  case = CASES["causal"]
  q, k, v = kc.qkv(case, 2, 16, dtype=jnp.bfloat16)
  args = (q, k, v, case.rule, case.q_slots, case.k_slots)
  assert attention.auto_choice("tpu", *args, chunk_q=128, chunk_k=128) == "chunked"  # 64 slots: off splash's grid
  assert attention.auto_choice("cpu", *kc.qkv(case, 2, 16), *args[3:]) == "flash_cpu"  # float32
  monkeypatch.setattr(attention, "_kernel_available", lambda name: name != "cudnn")  # e.g. no cuDNN
  assert attention.auto_choice("gpu", *args) == "pallas_gpu"
  # The platform is the mesh's: under an abstract mesh of GPUs, `attend` asks for the GPU choice.
  seen = []
  monkeypatch.setattr(attention, "auto_choice", lambda platform, *a, **kw: seen.append(platform) or "xla")
  from nsl import sharding
  monkeypatch.setattr(sharding, "platform", lambda: "gpu")
  attention.attend(q, k, v, case.rule, case.q_slots, case.k_slots)
  assert seen == ["gpu"]
