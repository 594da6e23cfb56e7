"""Shared cases for the kernel tests: every nsl rule, with several documents per row.

Each case is (rule, q Slots, k Slots) on small shapes; `check_against_dense` runs an
implementation and the dense reference (`nsl.nn.attention.attend_dense`) through the same jitted
loss and compares outputs, lse and gradients for q, k, v.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from nsl.nn import attention, masks
from nsl.models import sps

# Kernels run compiled on their own platform, in Pallas interpret mode elsewhere (CPU CI).
PLATFORM = jax.default_backend()

RTOL = 1e-4


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  rule: masks.Rule
  q_slots: attention.Slots
  k_slots: attention.Slots


def token_segments(num_tokens: int, doc_lengths_per_row) -> np.ndarray:
  """[B, T] document ids (1, 2, ...) from per-row document lengths (the rest is padding, id 0)."""
  out = np.zeros((len(doc_lengths_per_row), num_tokens), np.int32)
  for r, lengths in enumerate(doc_lengths_per_row):
    start = 0
    for d, n in enumerate(lengths):
      out[r, start:start + n] = d + 1
      start += n
  return out


def slot_segments(layout: masks.Layout, seg_tokens: np.ndarray) -> jnp.ndarray:
  """Segment id of each slot = that of its token (an SPS pair shares its document)."""
  return jnp.asarray(seg_tokens[:, layout.tok])


def _docs(num_tokens: int):
  """Two rows, several documents each, with different boundaries (and padding in row 1)."""
  a = num_tokens // 3
  return [[a - 3, a + 5, num_tokens - 2 * a - 2], [num_tokens // 2 + 1, num_tokens // 4]]


# Cases that only add layout/window combinations already covered elsewhere: marked slow.
EXTRA = ("sps_interleaved_w0", "delayed_stream_major")


def make_cases(num_tokens: int, window: int = 3) -> list[Case]:
  """All rules of the issue. Causal-layout rules use `2 * num_tokens` slots so every case has
  the same number of slots as the SPS ones. Names in EXTRA are redundant variants."""
  cases = []
  s = 2 * num_tokens
  causal = masks.Layout.causal(s)
  seg_c = slot_segments(causal, token_segments(s, _docs(s)))
  cs = attention.Slots(causal, segment=seg_c)
  cases.append(Case("causal", masks.Rule(), cs, cs))
  cases.append(Case("sliding_window", masks.Rule(persistent_window=window), cs, cs))
  cases.append(Case("sliding_window_0", masks.Rule(persistent_window=0), cs, cs))

  seg_t = token_segments(num_tokens, _docs(num_tokens))
  for name, variant, order in (("sps_interleaved", "sps", "interleaved"),
                                ("sps_stream_major", "sps", "stream_major"),
                                ("delayed", "delayed_state", "interleaved"),
                                ("delayed_stream_major", "delayed_state", "stream_major")):
    lay = sps.slot_layout(variant, num_tokens, order)
    sl = attention.Slots(lay, segment=slot_segments(lay, seg_t))
    cases.append(Case(name, masks.Rule(window=window), sl, sl))
    if name in ("sps_interleaved", "sps_stream_major"):
      cases.append(Case(name + "_w0", masks.Rule(window=0), sl, sl))

  # Double decoder: block ids shared across the batch ([1, S]), boundaries not tile-aligned.
  bounds = [s // 6, s // 2 - 3, s - s // 5]
  block = jnp.asarray(np.searchsorted(np.asarray(bounds), np.arange(s), side="right")[None].astype(np.int32))
  ds = attention.Slots(causal, segment=seg_c, block=block)
  cases.append(Case("dd_self", masks.Rule(block="same"), ds, ds))
  # Cross: k is the context stream. Block-0 rows of document 1 see only the sink (tok 0); block-0/1
  # rows of later documents see nothing at all (out 0, lse -inf).
  cases.append(Case("dd_cross", masks.Rule(causal=False, block="earlier", sink=True), ds, ds))
  return cases


def qkv(case: Case, heads: int, head_dim: int, dtype=jnp.float32, seed: int = 0):
  b = case.q_slots.segment.shape[0]
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  sq, sk = case.q_slots.layout.num_slots, case.k_slots.layout.num_slots
  return (jax.random.normal(kq, (b, sq, heads, head_dim), dtype),
          jax.random.normal(kk, (b, sk, heads, head_dim), dtype),
          jax.random.normal(kv, (b, sk, heads, head_dim), dtype))


def dense(case: Case):
  return lambda q, k, v: attention.attend_dense(q, k, v, case.rule, case.q_slots.fields(),
                                                case.k_slots.fields())


def _loss(fn):
  """A loss reading out and lse with non-trivial cotangents (lse's -inf rows contribute 0)."""
  def loss(q, k, v):
    out, lse = fn(q, k, v)
    out = out.astype(jnp.float32)
    finite = jnp.where(jnp.isfinite(lse), lse, 0.0)
    return jnp.sum(out * jnp.cos(out)) + jnp.sum(jnp.sin(finite)), (out, lse)
  return loss


# Interpret-mode kernels are large programs that run for milliseconds: compile them (and the
# reference) without XLA's expensive CPU optimisations, which halves the suite's time.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def fast_jit(fn):
  """jax.jit(fn) compiled with cheap CPU options (plain jit on accelerators)."""
  jitted = jax.jit(fn)

  def call(*args):
    with jax.default_matmul_precision("float32"):
      lowered = jitted.lower(*args)
    compiled = lowered.compile(_FAST_COMPILE) if PLATFORM == "cpu" else lowered.compile()
    return compiled(*args)

  return call


def run(fn, q, k, v):
  """(out, lse, (dq, dk, dv)) of `fn` through one jitted value-and-grad."""
  (_, (out, lse)), grads = fast_jit(jax.value_and_grad(_loss(fn), argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return np.asarray(out), np.asarray(lse), [np.asarray(g) for g in grads]


def assert_close(actual, expected, what, rtol=RTOL):
  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  scale = max(1.0, float(np.abs(expected[np.isfinite(expected)]).max(initial=0.0)))
  np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected), err_msg=f"{what}: -inf rows")
  fin = np.isfinite(expected)
  np.testing.assert_allclose(actual[fin], expected[fin], rtol=rtol, atol=rtol * scale, err_msg=what)


def check_against_dense(case: Case, fn, heads=2, head_dim=16, rtol=RTOL):
  q, k, v = qkv(case, heads, head_dim)
  out, lse, grads = run(fn, q, k, v)
  out_d, lse_d, grads_d = run(dense(case), q, k, v)
  assert_close(out, out_d, f"{case.name}: out", rtol)
  assert_close(lse, lse_d, f"{case.name}: lse", rtol)
  for name, g, gd in zip("qkv", grads, grads_d):
    assert np.isfinite(g).all(), f"{case.name}: d{name} not finite"
    assert_close(g, gd, f"{case.name}: d{name}", rtol)
  return lse_d
