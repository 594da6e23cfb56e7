"""The mask rule, written from its definition (DESIGN "Masks are data"), and block maps."""

import itertools

import numpy as np
import pytest

from nsl.nn import masks


def brute(rule, q, k):
  """Per-pair reading of the rule's docstring, no broadcasting."""
  out = np.zeros((len(q["pos"]), len(k["pos"])), bool)
  for i, j in itertools.product(range(len(q["pos"])), range(len(k["pos"]))):
    ok = True
    if rule.causal:
      ok &= q["pos"][i] >= k["pos"][j]
    if rule.same_segment:
      ok &= q["segment"][i] == k["segment"][j]
    d = q["tok"][i] - k["tok"][j]
    if k["kind"][j] == masks.TEMPORARY and rule.window is not None:
      ok &= d <= rule.window
    if k["kind"][j] == masks.PERSISTENT and rule.persistent_window is not None:
      ok &= d <= rule.persistent_window
    out[i, j] = ok
  return out


@pytest.mark.parametrize("rule", [masks.Rule(), masks.Rule(persistent_window=0), masks.Rule(persistent_window=3),
                                  masks.Rule(window=0), masks.Rule(window=2, persistent_window=4),
                                  masks.Rule(causal=False)])
def test_dense_mask_matches_definition(rule):
  t = 12
  pos = np.arange(2 * t)
  layout = masks.Layout(pos=pos, tok=pos // 2, kind=pos % 2)  # SPS-like: odd slots temporary
  seg = np.repeat([1, 2, 3], [8, 10, 6])
  got = masks.dense_mask(rule, layout, layout, {"segment": seg}, {"segment": seg})
  want = brute(rule, dict(layout.fields(), segment=seg), dict(layout.fields(), segment=seg))
  np.testing.assert_array_equal(got, want)


def test_block_map_is_exact_for_static_rules():
  t = 64
  layout = masks.Layout.causal(t)
  for rule in (masks.Rule(same_segment=False), masks.Rule(same_segment=False, persistent_window=9)):
    bm = masks.block_map(rule, layout, layout, 8, 8)
    dense = masks.dense_mask(rule, layout, layout).reshape(8, 8, 8, 8).transpose(0, 2, 1, 3)
    want = np.where(dense.all((2, 3)), masks.FULL, np.where(dense.any((2, 3)), masks.PARTIAL, masks.EMPTY))
    np.testing.assert_array_equal(bm, want)


def test_block_map_never_marks_full_when_dynamic_fields_apply():
  layout = masks.Layout.causal(32)
  bm = masks.block_map(masks.Rule(), layout, layout, 8, 8)
  assert masks.FULL not in bm
  assert (bm[np.tril_indices(4)] == masks.PARTIAL).all() and (bm[np.triu_indices(4, 1)] == masks.EMPTY).all()


def test_visible_pairs_counts_causal_triangle():
  layout = masks.Layout.causal(100)
  assert masks.visible_pairs(masks.Rule(), layout, layout) == 100 * 101 // 2
  assert masks.visible_pairs(masks.Rule(persistent_window=0), layout, layout) == 100


def test_layout_is_hashable_by_content():
  a, b = masks.Layout.causal(16), masks.Layout.causal(16)
  assert a == b and hash(a) == hash(b) and a != masks.Layout.causal(17)


def test_grouped_layouts_follow_references():
  """SPS pairs (REFERENCES §1): x_i at logical slot 2i, ρ_i at 2i + 1, both tok = i."""
  p, t = masks.PERSISTENT, masks.TEMPORARY
  inter = masks.Layout.grouped((p, t), 4)
  np.testing.assert_array_equal(inter.pos, np.arange(8))
  np.testing.assert_array_equal(inter.tok, [0, 0, 1, 1, 2, 2, 3, 3])
  np.testing.assert_array_equal(inter.kind, [0, 1] * 4)  # x persistent, ρ temporary
  sm = masks.Layout.grouped((p, t), 4, "stream_major")
  np.testing.assert_array_equal(sm.pos, [0, 2, 4, 6, 1, 3, 5, 7])  # [x1..xT | ρ1..ρT]
  np.testing.assert_array_equal(sm.tok, [0, 1, 2, 3, 0, 1, 2, 3])
  np.testing.assert_array_equal(sm.kind, [0] * 4 + [1] * 4)
  np.testing.assert_array_equal(masks.Layout.grouped((t, p), 4).kind, [1, 0] * 4)  # delayed: swapped
  assert masks.Layout.grouped((p,), 5, "stream_major") == masks.Layout.causal(5)  # one slot: no order
  three = masks.Layout.grouped((p, t, t), 2, "stream_major")  # any group size: slot j of every token
  np.testing.assert_array_equal(three.pos, [0, 3, 1, 4, 2, 5])
  np.testing.assert_array_equal(three.tok, [0, 1, 0, 1, 0, 1])
  np.testing.assert_array_equal(three.kind, [0, 0, 1, 1, 1, 1])


@pytest.mark.parametrize("kinds, order", [((0, 1), "token_major"), ((), "interleaved"), ((0, 2), "interleaved")])
def test_grouped_layout_rejects_bad_arguments(kinds, order):
  with pytest.raises(ValueError):
    masks.Layout.grouped(kinds, 4, order)
