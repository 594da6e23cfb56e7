"""Visible-pair counts and tile maps are computed from intervals, not the slot-by-slot mask:
equal to the dense reference on every rule and layout, and cheap at long context."""

import itertools
import time

import numpy as np
import pytest

from nsl.nn import masks
from nsl.models import sps as sps_family
from tests.helpers import run_cli


def _layouts():
  sps = sps_family.slot_layout("sps", 32, "interleaved")
  perm = np.random.default_rng(0).permutation(64)
  return {
      "causal": masks.Layout.causal(64),
      "sps": sps,
      "sps_stream_major": sps_family.slot_layout("sps", 32, "stream_major"),
      "sps_rho_persistent": sps_family.slot_layout("delayed_state", 32, "interleaved"),
      "shuffled": masks.Layout(pos=sps.pos[perm], tok=sps.tok[perm], kind=sps.kind[perm]),
      "tok_decreasing": masks.Layout(pos=np.arange(64), tok=63 - np.arange(64), kind=np.arange(64) % 2),
  }


@pytest.mark.parametrize("name", list(_layouts()))
def test_counts_and_block_maps_equal_the_dense_reference(name):
  lay = _layouts()[name]
  for causal, w, pw, seg in itertools.product([True, False], [None, 0, 3, 17], [None, 0, 5], [True, False]):
    rule = masks.Rule(causal=causal, window=w, persistent_window=pw, same_segment=seg)
    dense = np.broadcast_to(masks.dense_mask(rule, lay, lay), (64, 64))
    assert masks.visible_pairs(rule, lay, lay) == int(dense.sum()), rule
    for bq, bk in ((8, 8), (16, 4), (4, 16)):
      tiles = dense.reshape(64 // bq, bq, 64 // bk, bk)
      full = tiles.all(axis=(1, 3)) & (not rule.dynamic_fields)
      want = np.where(tiles.any(axis=(1, 3)), np.where(full, masks.FULL, masks.PARTIAL), masks.EMPTY)
      np.testing.assert_array_equal(masks.block_map(rule, lay, lay, bq, bk), want, err_msg=f"{rule} {bq}x{bk}")


def test_long_context_counting_is_cheap():
  lay = sps_family.slot_layout("sps", 65536, "stream_major")  # 131,072 slots: a 17e9-entry mask
  t0 = time.time()
  pairs = masks.visible_pairs(masks.Rule(window=64), lay, lay)
  assert time.time() - t0 < 2.0
  # Every query sees the x keys up to its token and the rho keys within the window.
  want = sum(i + 1 + min(i, 64) + 1 for i in range(65536)) + sum(i + 1 + min(i, 64) for i in range(65536))
  assert pairs == want


def test_describe_at_long_context_is_fast_and_impossible_sizes_are_one_line():
  t0 = time.time()
  out = run_cli("-m", "nsl.launch", "--config=configs/sps_tiny.py", "--mode=describe", "--config.data.seq_len=65536")
  assert out.returncode == 0, out.stderr
  assert time.time() - t0 < 30
  out = run_cli("-m", "nsl.launch", "--config=configs/sps_tiny.py", "--mode=describe", "--config.data.seq_len=10000000")
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1 and "config.data.seq_len" in lines[0], out.stderr
