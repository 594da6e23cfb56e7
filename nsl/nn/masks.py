"""Attention visibility as data: a static rule over per-slot metadata (docs/design.md#masks).

Every attention in every family asks "may query slot q see key slot k?". The answer is one
pure function, `visible(rule, q, k)`, over per-slot metadata:

- `pos`     logical order of the slot (causality): for SPS the interleaved slot index 2i + j;
- `tok`     token index of the slot (also its RoPE position);
- `kind`    PERSISTENT or TEMPORARY (SPS §1: temporary keys are windowed);
- `segment` document id inside a packed row (0 = padding), dynamic per example;
- `block`   double-decoder block id, dynamic per step.

`pos`, `tok` and `kind` depend only on the family and the sequence length, so they form a static
`Layout` (numpy, hashable) known at trace time; from it `block_map` tells on the host which
(query tile, key tile) pairs the rule makes empty, so every backend can skip them. `segment` and
`block` stay dynamic arrays and are applied per element.

The same `visible` is evaluated by numpy (tests, block maps, `dense_mask`) and by jax.numpy (the
XLA paths): it uses only broadcasting comparison and boolean operators.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import numpy as np

PERSISTENT = 0
TEMPORARY = 1

EMPTY, PARTIAL, FULL = 0, 1, 2  # block-map codes, as in splash attention

# Physical orders of a row whose tokens each own a group of G slots (`Layout.grouped`).
ORDERS = ("interleaved", "stream_major")


@dataclasses.dataclass(frozen=True)
class Rule:
  """A static, hashable visibility rule. All conditions are conjoined.

  causal:            `pos(q) >= pos(k)`.
  same_segment:      `segment(q) == segment(k)` (packed documents never see each other).
  window:            temporary keys visible iff `tok(q) - tok(k) <= window` (SPS rule 3);
                     None = unbounded. Persistent keys are unaffected.
  persistent_window: persistent keys visible iff `tok(q) - tok(k) <= persistent_window`
                     (the Δℓ(M_ω) probe of SPS §1; for an all-persistent layout this is a plain
                     sliding window). None = unbounded.
  block:             None, 'same' (`block(q) == block(k)`) or 'earlier'
                     (`block(k) < block(q)`), the double-decoder rules (docs/papers/double_decoder.md#masks).
  sink:              with block='earlier': the key at `tok == 0` is also visible (so block 0
                     has a non-empty row).
  """

  causal: bool = True
  same_segment: bool = True
  window: int | None = None
  persistent_window: int | None = None
  block: str | None = None
  sink: bool = False

  def __post_init__(self):
    if self.block not in (None, "same", "earlier"):
      raise ValueError(f"Rule.block must be None, 'same' or 'earlier', got {self.block!r}")
    for name in ("window", "persistent_window"):
      v = getattr(self, name)
      if v is not None and v < 0:
        raise ValueError(f"Rule.{name} must be >= 0 or None, got {v}")

  @property
  def dynamic_fields(self) -> tuple[str, ...]:
    """Metadata fields the rule reads that are not part of the static layout."""
    fields = ("segment",) if self.same_segment else ()
    return fields + (("block",) if self.block is not None else ())


def visible(rule: Rule, q: Mapping[str, Any], k: Mapping[str, Any]):
  """Whether query slots `q` may see key slots `k` (broadcasting numpy or jax arrays).

  `q` and `k` map metadata names to arrays already shaped to broadcast against each other,
  e.g. `q['pos'][:, None]` against `k['pos'][None, :]`. Fields the rule does not read may be
  absent. Missing dynamic fields are treated as "could be visible" (used by `block_map`).
  """
  vis = True
  if rule.causal:
    vis = vis & (q["pos"] >= k["pos"])
  if rule.window is not None or rule.persistent_window is not None:
    dist = q["tok"] - k["tok"]
    is_persistent = k["kind"] == PERSISTENT
    if rule.window is not None:
      vis = vis & (is_persistent | (dist <= rule.window))
    if rule.persistent_window is not None:
      vis = vis & (~is_persistent | (dist <= rule.persistent_window))
  if rule.same_segment and "segment" in q and "segment" in k:
    vis = vis & (q["segment"] == k["segment"])
  if rule.block is not None and "block" in q and "block" in k:
    if rule.block == "same":
      vis = vis & (q["block"] == k["block"])
    else:
      earlier = k["block"] < q["block"]
      if rule.sink:
        earlier = earlier | (k["tok"] == 0)
      vis = vis & earlier
  return vis


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
  """Static per-slot metadata of one row: numpy int32 arrays `pos`, `tok`, `kind` of shape [S].

  Hashable by content so it can be a static argument of jitted functions and a cache key for
  block maps.
  """

  pos: np.ndarray
  tok: np.ndarray
  kind: np.ndarray

  def __post_init__(self):
    for name in ("pos", "tok", "kind"):
      arr = np.asarray(getattr(self, name), dtype=np.int32)
      arr.setflags(write=False)
      object.__setattr__(self, name, arr)
    if not (self.pos.shape == self.tok.shape == self.kind.shape and self.pos.ndim == 1):
      raise ValueError("Layout fields must be 1-D arrays of equal length")

  @property
  def num_slots(self) -> int:
    return int(self.pos.shape[0])

  def fields(self) -> dict[str, np.ndarray]:
    return {"pos": self.pos, "tok": self.tok, "kind": self.kind}

  def _key(self) -> bytes:
    return self.pos.tobytes() + b"|" + self.tok.tobytes() + b"|" + self.kind.tobytes()

  def __hash__(self) -> int:
    return hash(self._key())

  def __eq__(self, other) -> bool:
    return isinstance(other, Layout) and self._key() == other._key()

  @staticmethod
  def causal(num_tokens: int) -> "Layout":
    """The standard layout: one persistent slot per token, in order."""
    ar = np.arange(num_tokens, dtype=np.int32)
    return Layout(pos=ar, tok=ar, kind=np.zeros_like(ar))

  @staticmethod
  def grouped(kinds: Sequence[int], num_tokens: int, order: str = "interleaved") -> "Layout":
    """G = len(kinds) slots per token, slot j of token i of kind `kinds[j]`, in physical `order`.

    Logical order is always token-major: slot j of token i has `pos = G·i + j` and `tok = i`
    (for SPS, G = 2 and the pair (x_i, ρ_i) sits at 2i and 2i + 1, docs/papers/sps.md#layout). The physical
    order is `interleaved` (the logical order, [x1, ρ1, x2, ρ2, …]) or `stream_major` (every
    token's slot 0, then every token's slot 1, …: [x1..xT | ρ1..ρT]). The one place a
    family's per-token slot groups become per-slot metadata (the model, prefill, tests and
    benchmarks all call it).
    """
    if order not in ORDERS:
      raise ValueError(f"unknown slot order {order!r}; choose one of {ORDERS}")
    kinds_G = np.asarray(kinds, np.int32)
    if kinds_G.ndim != 1 or kinds_G.size == 0 or not np.isin(kinds_G, (PERSISTENT, TEMPORARY)).all():
      raise ValueError(f"kinds must be a non-empty sequence of PERSISTENT ({PERSISTENT}) / TEMPORARY "
                       f"({TEMPORARY}), got {kinds!r}")
    g = kinds_G.size
    pos = np.arange(g * num_tokens, dtype=np.int32)  # logical slot index G·i + j
    if order == "stream_major":
      pos = pos.reshape(num_tokens, g).T.reshape(-1)
    return Layout(pos=pos, tok=pos // g, kind=kinds_G[pos % g])


def _expand(fields: Mapping[str, Any], axis: int) -> dict[str, Any]:
  """Adds a broadcast axis: axis=-1 for queries ([..., S, 1]), axis=-2 for keys ([..., 1, S])."""
  return {name: (a[..., :, None] if axis == -1 else a[..., None, :]) for name, a in fields.items()}


def dense_mask(rule: Rule, q_layout: Layout, k_layout: Layout, q_dynamic: Mapping[str, Any] | None = None,
               k_dynamic: Mapping[str, Any] | None = None):
  """Materialises the rule as a boolean mask [..., Sq, Sk] (numpy or jax, following the inputs).

  `q_dynamic` / `k_dynamic` hold the dynamic fields (`segment`, `block`) with shape [..., S].
  """
  q = dict(q_layout.fields(), **(q_dynamic or {}))
  k = dict(k_layout.fields(), **(k_dynamic or {}))
  return visible(rule, _expand(q, -1), _expand(k, -2))


def _key_intervals(rule: Rule, q_fields: Mapping[str, np.ndarray], k_layout: "Layout"):
  """For each key kind: (slot indices of that kind, their rank in an order where every query's
  visible keys of that kind form one interval, lo [Sq], hi [Sq]) — or None when the layout has no
  such order (then callers evaluate the rule tile by tile).

  Causal rules order keys by (pos, tok): the keys with pos <= pos(q) are a prefix; with a window
  the keys with tok >= tok(q) - w are a suffix only if tok never decreases along that order
  (true of every nsl layout: a slot's token index follows its logical position). Non-causal
  rules order keys by tok. O(S log S) time and O(S) memory; dynamic fields are not read.
  """
  q_pos, q_tok = q_fields["pos"].astype(np.int64), q_fields["tok"].astype(np.int64)
  k_pos, k_tok, k_kind = (k_layout.pos.astype(np.int64), k_layout.tok.astype(np.int64), k_layout.kind)
  out = []
  for kind, window in ((PERSISTENT, rule.persistent_window), (TEMPORARY, rule.window)):
    idx = np.flatnonzero(k_kind == kind)
    if idx.size == 0:
      continue
    p, t = k_pos[idx], k_tok[idx]
    order = np.lexsort((t, p)) if rule.causal else np.argsort(t, kind="stable")
    ps, ts = p[order], t[order]
    if window is not None and rule.causal and ts.size > 1 and np.any(ts[1:] < ts[:-1]):
      return None
    hi = np.searchsorted(ps, q_pos, side="right") if rule.causal else np.full(q_pos.shape, idx.size)
    lo = np.searchsorted(ts, q_tok - window, side="left") if window is not None else np.zeros(q_pos.shape, np.int64)
    rank = np.empty(idx.size, np.int64)
    rank[order] = np.arange(idx.size)
    out.append((idx, rank, lo, np.maximum(hi, lo)))
  return out


@functools.lru_cache(maxsize=256)
def block_map(rule: Rule, q_layout: Layout, k_layout: Layout, block_q: int, block_k: int) -> np.ndarray:
  """Host-side tile classification [Sq/block_q, Sk/block_k]: EMPTY, PARTIAL or FULL.

  Computed from the static layout only. A tile is EMPTY when no (q, k) pair in it can be visible
  whatever the dynamic fields are; FULL when every pair is visible and the rule reads no dynamic
  field; PARTIAL otherwise. Backends skip EMPTY tiles and need no mask on FULL ones.
  Cost: each query's visible keys of a kind are one interval of ranks (`_key_intervals`) and each
  key tile's keys of a kind one range of ranks, so a tile's count is an interval overlap:
  O(Sq · Sk/block_k) time and O(S + tiles) memory, never the slot-by-slot mask. Layouts without
  that structure fall back to evaluating the rule one tile row at a time.
  """
  sq, sk = q_layout.num_slots, k_layout.num_slots
  if sq % block_q or sk % block_k:
    raise ValueError(f"slots ({sq}, {sk}) must be multiples of the blocks ({block_q}, {block_k})")
  nq, nk = sq // block_q, sk // block_k
  has_dynamic = bool(rule.dynamic_fields)
  intervals = _key_intervals(rule, q_layout.fields(), k_layout)
  ranges = []
  if intervals is not None:
    for idx, rank, lo, hi in intervals:
      tile = idx // block_k
      count = np.bincount(tile, minlength=nk)
      first = np.full(nk, np.iinfo(np.int64).max)
      last = np.full(nk, -1, np.int64)
      np.minimum.at(first, tile, rank)
      np.maximum.at(last, tile, rank)
      present = count > 0
      if np.any(last[present] - first[present] + 1 != count[present]):
        intervals = None  # a tile's keys are not one range of ranks: evaluate the rule instead
        break
      ranges.append((np.where(present, first, 0), np.where(present, last + 1, 0), lo, hi))
  out = np.empty((nq, nk), dtype=np.int8)
  if intervals is not None:
    rows = max(1, (1 << 22) // max(1, nk * block_q))  # query tiles per chunk: bounded memory
    for i0 in range(0, nq, rows):
      sl = slice(i0 * block_q, min(nq, i0 + rows) * block_q)
      seen = None
      for a, b, lo, hi in ranges:
        ov = np.minimum(hi[sl, None], b[None, :]) - np.maximum(lo[sl, None], a[None, :])
        ov = np.maximum(ov, 0)
        seen = ov if seen is None else seen + ov
      seen = seen.reshape(-1, block_q, nk)
      any_vis = seen.max(axis=1) > 0
      all_vis = seen.min(axis=1) == block_k
      out[i0:i0 + seen.shape[0]] = np.where(any_vis, np.where(all_vis & (not has_dynamic), FULL, PARTIAL), EMPTY)
    return out
  qf, kf = q_layout.fields(), k_layout.fields()
  for i in range(nq):
    sl = slice(i * block_q, (i + 1) * block_q)
    q = {n: a[sl][:, None] for n, a in qf.items()}
    vis = np.broadcast_to(visible(rule, q, {n: a[None, :] for n, a in kf.items()}), (block_q, sk))
    tiles = vis.reshape(block_q, nk, block_k)
    any_vis = tiles.any(axis=(0, 2))
    all_vis = tiles.all(axis=(0, 2))
    out[i] = np.where(any_vis, np.where(all_vis & (not has_dynamic), FULL, PARTIAL), EMPTY)
  return out


def visible_pairs(rule: Rule, q_layout: Layout, k_layout: Layout) -> int:
  """Number of visible (q, k) pairs of one row under the static rule (for FLOP counting).

  Counted analytically from intervals (`_key_intervals`): O(S log S) time, O(S) memory, so
  `--mode=describe` of a long-context config stays instant. Layouts without that structure are
  counted tile by tile (bounded memory, quadratic time)."""
  intervals = _key_intervals(rule, q_layout.fields(), k_layout)
  if intervals is not None:
    return int(sum(int((hi - lo).sum()) for _, _, lo, hi in intervals))
  qf, kf = q_layout.fields(), k_layout.fields()
  total = 0
  step = max(1, (1 << 22) // max(1, k_layout.num_slots))
  for start in range(0, q_layout.num_slots, step):
    q = {n: a[start:start + step][:, None] for n, a in qf.items()}
    vis = visible(rule, q, {n: a[None, :] for n, a in kf.items()})
    total += int(np.broadcast_to(vis, (min(step, q_layout.num_slots - start), k_layout.num_slots)).sum())
  return total
