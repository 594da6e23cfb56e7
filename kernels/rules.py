"""Host-side tile plans for the attention kernels, built from `nsl.nn.masks` rules.

Everything here is static: it reads the rule and the static per-slot `Layout` (pos, tok, kind),
never the dynamic segment / block ids, which the kernels apply per element. The tile
classification itself is `nsl.nn.masks.block_map` (EMPTY / PARTIAL / FULL); this module only
reshapes it into what the kernels iterate over:

- `tile_lists`: for each query tile the padded list of its non-empty key tiles (forward and
  dq kernels), and for each key tile the padded list of its non-empty query tiles (dk/dv
  kernel), with counts. Lists are padded with -1 to a power-of-two length (Triton tensors).
- `layout_runs`: a compact arithmetic description of a layout (a few runs, each periodic with a
  power-of-two period and affine per residue) so that kernels without gathers (splash's
  computable masks on TPU) can recompute pos/tok/kind from a slot index in O(1) memory.

It takes any `masks.Rule` and `masks.Layout` and knows no model family: the families build
their layouts (`masks.Layout.grouped`, `nsl.models.sps.slot_layout`).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from nsl.nn import masks

PAD = -1  # padding entry of the tile lists


def _next_pow2(n: int) -> int:
  return 1 << max(0, int(n - 1).bit_length())


@dataclasses.dataclass(frozen=True, eq=False)
class TileLists:
  """Non-empty tiles of one (rule, layouts, block sizes), in the forms the kernels iterate over.

  block_map [nq, nk] int8  EMPTY / PARTIAL / FULL (from `nsl.nn.masks.block_map`).
  kv_index  [nq, P] int32  for query tile i, its non-empty key tiles in increasing order, then PAD.
  kv_count  [nq] int32     number of valid entries of each row of kv_index.
  q_index   [nk, P'] int32 for key tile j, its non-empty query tiles in increasing order, then PAD.
  q_count   [nk] int32
  """

  block_q: int
  block_k: int
  block_map: np.ndarray
  kv_index: np.ndarray
  kv_count: np.ndarray
  q_index: np.ndarray
  q_count: np.ndarray

  @property
  def num_visited(self) -> int:
    return int(self.kv_count.sum())

  @property
  def fraction_visited(self) -> float:
    return self.num_visited / self.block_map.size


def _pad_lists(nonempty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Rows of a boolean matrix -> (padded index lists [n, P], counts [n])."""
  counts = nonempty.sum(axis=1).astype(np.int32)
  width = _next_pow2(max(1, int(counts.max(initial=0))))
  index = np.full((nonempty.shape[0], width), PAD, np.int32)
  for r, row in enumerate(nonempty):
    cols = np.flatnonzero(row)
    index[r, :cols.size] = cols
  return index, counts


@functools.lru_cache(maxsize=256)
def tile_lists(rule: masks.Rule, q_layout: masks.Layout, k_layout: masks.Layout, block_q: int,
               block_k: int) -> TileLists:
  bm = masks.block_map(rule, q_layout, k_layout, block_q, block_k)
  nonempty = bm != masks.EMPTY
  kv_index, kv_count = _pad_lists(nonempty)
  q_index, q_count = _pad_lists(nonempty.T)
  for a in (bm, kv_index, kv_count, q_index, q_count):
    a.setflags(write=False)
  return TileLists(block_q, block_k, bm, kv_index, kv_count, q_index, q_count)


def tile_fraction(rule: masks.Rule, q_layout: masks.Layout, k_layout: masks.Layout, block_q: int,
                  block_k: int) -> float:
  """Fraction of the (query tile, key tile) grid that a block-sparse kernel visits."""
  return tile_lists(rule, q_layout, k_layout, block_q, block_k).fraction_visited


def causal_triangle_tiles(num_slots: int, block: int) -> int:
  """Tiles of the plain causal triangle over `num_slots` slots (the dense-causal kernel's work)."""
  n = num_slots // block
  return n * (n + 1) // 2


# ----------------------------------------------------------------------------- arithmetic runs


@dataclasses.dataclass(frozen=True)
class Run:
  """Slots [start, stop): with d = i - start, u = d >> log2(period), m = d & (period - 1),
  field(i) = slope[field][m] * u + offset[field][m] for field in pos, tok, kind."""

  start: int
  stop: int
  period: int
  slope: tuple[tuple[int, ...], ...]   # [3][period]
  offset: tuple[tuple[int, ...], ...]  # [3][period]


FIELDS = ("pos", "tok", "kind")
MAX_RUNS = 8
_PERIODS = (1, 2, 4, 8)


def _fit_runs(values: np.ndarray, period: int, max_runs: int) -> list[Run] | None:
  """Greedy cover of `values` [3, S] by periodic-affine runs; None if more than max_runs."""
  s = values.shape[1]
  runs: list[Run] = []
  start = 0
  while start < s:
    if len(runs) == max_runs:
      return None
    rest = values[:, start:]
    n = rest.shape[1]
    m = np.arange(n) % period
    u = np.arange(n) // period
    offset = rest[:, :min(period, n)]
    if n >= 2 * period:
      slope = rest[:, period:2 * period] - offset
    else:
      slope = np.zeros_like(offset)
    pad = period - offset.shape[1]
    if pad:
      offset = np.pad(offset, ((0, 0), (0, pad)))
      slope = np.pad(slope, ((0, 0), (0, pad)))
    pred = slope[:, m] * u + offset[:, m]
    bad = np.flatnonzero((pred != rest).any(axis=0))
    length = int(bad[0]) if bad.size else n
    length = max(length, 1)
    runs.append(Run(start, start + length, period,
                    tuple(tuple(int(x) for x in row) for row in slope),
                    tuple(tuple(int(x) for x in row) for row in offset)))
    start += length
  return runs


@functools.lru_cache(maxsize=256)
def layout_runs(layout: masks.Layout, max_runs: int = MAX_RUNS) -> tuple[Run, ...] | None:
  """The fewest periodic-affine runs (period 1, 2, 4 or 8) reproducing pos, tok and kind.

  Causal layouts and two-slot `masks.Layout.grouped` layouts (SPS's (x, ρ) pairs, either kinds)
  are one run interleaved, two stream-major. None when the layout needs more than `max_runs`
  runs (then it cannot be recomputed cheaply from a slot index).
  """
  values = np.stack([layout.pos, layout.tok, layout.kind]).astype(np.int64)
  best = None
  for period in _PERIODS:
    runs = _fit_runs(values, period, max_runs)
    if runs is not None and (best is None or len(runs) < len(best)):
      best = runs
  return None if best is None else tuple(best)


def eval_runs(runs: tuple[Run, ...], index, select):
  """pos, tok, kind of slot indices `index` (numpy or jax int32 array) from `layout_runs`.

  `select(cond, a, b)` is np.where or jnp.where; only shifts, masks, multiply-adds, compares and
  selects are used, so this lowers inside TPU (Mosaic) kernels.
  """
  out = [None, None, None]
  for run in runs:
    d = index - run.start
    shift = run.period.bit_length() - 1
    u = d >> shift if shift else d
    m = d & (run.period - 1) if shift else None
    inside = (index >= run.start) & (index < run.stop)
    for f in range(3):
      val = _affine(run.slope[f], run.offset[f], u, m, select)
      out[f] = val if out[f] is None else select(inside, val, out[f])
  return dict(zip(FIELDS, out))


def _affine(slope, offset, u, m, select):
  def pick(vals):
    if len(set(vals)) == 1:
      return vals[0]
    res = vals[-1]
    for r in range(len(vals) - 2, -1, -1):
      res = select(m == r, vals[r], res)
    return res

  a, b = pick(slope), pick(offset)
  if isinstance(a, int) and a == 0:
    return u * 0 + b
  if isinstance(a, int) and a == 1:
    return u + b
  return a * u + b
