"""The chunked path equals the dense reference on packed rows (values and gradients), and LSE merges."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.nn import attention, masks


def _inputs(b=2, s=64, h=2, d=8, seed=0):
  q, k, v = (jax.random.normal(key, (b, s, h, d)) for key in jax.random.split(jax.random.PRNGKey(seed), 3))
  a, c = s * 5 // 16, s * 15 // 16
  rows = [np.repeat([1, 2, 3], [a, c - a, s - c]), np.repeat([1, 2], [s * 5 // 8, s - s * 5 // 8])]
  return q, k, v, jnp.asarray(np.stack(rows[:b]), jnp.int32)


@pytest.fixture(params=["rows", "scan"])
def schedule(request, monkeypatch):
  """Both schedules of the chunked path: rows (CPU's default) and the scan accelerators run."""
  monkeypatch.setattr(attention, "_row_schedule", lambda: request.param == "rows")
  return request.param


def _loss(impl, rule, layout, segment, chunk=16):
  slots = attention.Slots(layout, segment=segment)

  def f(q, k, v):
    out, lse = attention.attend(q, k, v, rule, slots, slots, impl=impl, chunk_q=chunk, chunk_k=chunk,
                                return_lse=True)
    lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return jnp.sum(out * jnp.cos(out)) + jnp.sum(jnp.sin(lse))

  return jax.jit(f)  # one compile per test, not one per primitive


@pytest.mark.parametrize("rule", [masks.Rule(), masks.Rule(persistent_window=5), masks.Rule(persistent_window=0)])
def test_chunked_matches_dense_values_and_gradients(rule, schedule):
  q, k, v, segment = _inputs()
  layout = masks.Layout.causal(q.shape[1])
  dense = _loss("xla", rule, layout, segment)
  chunked = _loss("chunked", rule, layout, segment)
  # a scalar sum over many O(1) terms: fp32 rounding of the summands, not relative to the sum
  np.testing.assert_allclose(chunked(q, k, v), dense(q, k, v), rtol=1e-5, atol=1e-4)
  for gc, gd in zip(jax.jit(jax.grad(chunked, (0, 1, 2)))(q, k, v), jax.jit(jax.grad(dense, (0, 1, 2)))(q, k, v)):
    np.testing.assert_allclose(gc, gd, atol=2e-5)


def test_chunked_handles_interleaved_temporary_keys_and_empty_rows(schedule):
  q, k, v, segment = _inputs(s=32)
  pos = np.arange(32)
  layout = masks.Layout(pos=pos, tok=pos // 2, kind=pos % 2)
  rule = masks.Rule(window=1)
  seg0 = segment.at[:, :4].set(0)  # padding rows see only padding
  for seg in (segment, seg0):
    np.testing.assert_allclose(_loss("chunked", rule, layout, seg, chunk=8)(q, k, v),
                               _loss("xla", rule, layout, seg)(q, k, v), rtol=1e-5)


def test_fully_masked_rows_give_zero_and_neg_inf_lse(schedule):
  q, k, v, _ = _inputs(b=1, s=16)
  layout = masks.Layout.causal(16)
  qs = attention.Slots(layout, segment=jnp.ones((1, 16), jnp.int32))
  ks = attention.Slots(layout, segment=jnp.full((1, 16), 2, jnp.int32))
  for impl in ("xla", "chunked"):
    out, lse = attention.attend(q, k, v, masks.Rule(), qs, ks, impl=impl, chunk_q=8, chunk_k=8, return_lse=True)
    assert float(jnp.abs(out).max()) == 0.0 and bool(jnp.all(jnp.isneginf(lse)))


def test_merge_lse_equals_softmax_over_union():
  q, k, v, segment = _inputs(b=1, s=32)
  layout = masks.Layout.causal(32)
  slots = attention.Slots(layout)
  split = jnp.asarray((np.arange(32) % 3 == 0).astype(np.int32))[None]
  full = attention.attend(q, k, v, masks.Rule(same_segment=False), slots, slots, impl="xla")
  parts = []
  for side in (0, 1):
    ks = attention.Slots(layout, block=split)
    qs = attention.Slots(layout, block=jnp.full((1, 32), 1 - side, jnp.int32) * 0 + side)
    # keys with block == side only: rule "same block" against a query block of `side`
    parts.append(attention.attend(q, k, v, masks.Rule(same_segment=False, block="same"), qs, ks, impl="xla",
                                  return_lse=True))
  merged, _ = attention.merge_lse(*parts[0], *parts[1])
  np.testing.assert_allclose(merged, full, atol=1e-5)


def test_auto_tile_size_is_128_for_chunked_on_cpu_and_512_for_kernels():
  # the host platform here is CPU (the measured choice, `attention.tile_size`)
  assert attention.tile_size("chunked") == attention.CPU_TILE == 128
  assert attention.tile_size("splash") == attention.DEFAULT_TILE == 512


@pytest.mark.parametrize("order", ["stream_major", "interleaved"])
def test_chunked_matches_dense_on_sps_slots_with_split_key_runs(order, schedule):
  # stream-major SPS slots: a query chunk's visible key chunks are two runs (persistent triangle,
  # temporary band) that the row schedule concatenates; gradients scatter back to both
  q, k, v, segment = _inputs(b=2, s=64)
  layout = masks.Layout.grouped((masks.PERSISTENT, masks.TEMPORARY), 32, order)
  seg = jnp.repeat(segment[:, ::2], 2, axis=1) if order == "interleaved" else jnp.tile(segment[:, ::2], (1, 2))
  rule = masks.Rule(window=3)
  plan = attention._plan(rule, layout, layout, 8, 8)
  if order == "stream_major":
    assert any(len(r) > 1 for r in attention._key_runs(plan))
  chunked, dense = _loss("chunked", rule, layout, seg, chunk=8), _loss("xla", rule, layout, seg)
  np.testing.assert_allclose(chunked(q, k, v), dense(q, k, v), rtol=1e-5, atol=1e-4)
  for gc, gd in zip(jax.jit(jax.grad(chunked, (0, 1, 2)))(q, k, v), jax.jit(jax.grad(dense, (0, 1, 2)))(q, k, v)):
    np.testing.assert_allclose(gc, gd, atol=2e-5)


def test_auto_tiles_match_dense_at_256_slots():
  # chunk 0 (auto) at 256 slots runs two 128-row chunks (CPU's tile), not one dense tile
  q, k, v, segment = _inputs(b=2, s=256, h=2, d=8)
  layout = masks.Layout.causal(256)
  rule = masks.Rule()
  auto = _loss("chunked", rule, layout, segment, chunk=0)
  dense = _loss("xla", rule, layout, segment)
  np.testing.assert_allclose(auto(q, k, v), dense(q, k, v), rtol=1e-5, atol=1e-3)
  for ga, gd in zip(jax.jit(jax.grad(auto, (0, 1, 2)))(q, k, v), jax.jit(jax.grad(dense, (0, 1, 2)))(q, k, v)):
    np.testing.assert_allclose(ga, gd, atol=5e-5)
