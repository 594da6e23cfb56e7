"""T5-style span corruption with static shapes (the SED baseline, docs/papers/double_decoder.md#baselines).

For a row of L tokens, the numbers of noise tokens `n = round(L * noise_density)` and of noise
spans `s = round(n / mean_span)` are static, so every output shape is static too: encoder inputs
have `L - n + s` tokens (each noise span replaced by one sentinel), decoder targets `n + s`
(each kept span replaced by one sentinel, followed by the noise span it precedes). Only *where*
the spans fall is random (a random segmentation of the n noise and L - n kept tokens into s
spans each, interleaved kept/noise, as in T5's `random_spans_noise_mask`), so batches never
recompile. Everything is jax.numpy, one row at a time (vmap it), driven by a PRNG key.

Sentinel k (k = 0..99) is the id `vocab_size - 1 - k`, the top of the model's vocabulary (T5's
convention), so the vocabulary must be padded by the sentinels above the tokenizer's ids; the
decoder-start id is `vocab_size - 1 - sentinels`, just below them. Spans are drawn over the packed
row: document ids (`segment`) travel with the tokens, a target sentinel takes the document of the
noise token it announces, and SED attention never crosses documents.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def counts(length: int, noise_density: float = 0.15, mean_span: float = 4.0) -> tuple[int, int]:
  """(noise tokens, noise spans) for a row of `length` tokens; both >= 1."""
  num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
  num_spans = max(min(int(round(num_noise / mean_span)), num_noise, length - num_noise), 1)
  return num_noise, num_spans


def lengths(length: int, noise_density: float = 0.15, mean_span: float = 4.0) -> tuple[int, int]:
  """(encoder length, target length) after corruption."""
  n, s = counts(length, noise_density, mean_span)
  return length - n + s, n + s


def _random_segmentation(rng, num_items: int, num_segments: int):
  """Lengths [num_segments] >= 1 summing to num_items, uniformly random compositions."""
  first = jnp.arange(num_items - 1) < num_segments - 1
  first = jax.random.permutation(rng, first)
  seg_id = jnp.cumsum(jnp.concatenate([jnp.zeros((1,), jnp.int32), first.astype(jnp.int32)]))
  return jax.ops.segment_sum(jnp.ones((num_items,), jnp.int32), seg_id, num_segments)


def noise_mask(rng, length: int, noise_density: float = 0.15, mean_span: float = 4.0):
  """(is_noise [L] bool, span number [L] int32): spans alternate kept (even), noise (odd),
  starting with a kept span and ending with a noise span."""
  n, s = counts(length, noise_density, mean_span)
  k_noise, k_keep = jax.random.split(rng)
  noise_len = _random_segmentation(k_noise, n, s)
  keep_len = _random_segmentation(k_keep, length - n, s)
  starts = jnp.cumsum(jnp.stack([keep_len, noise_len], axis=1).reshape(-1))[:-1]
  span_num = jnp.cumsum(jnp.zeros((length,), jnp.int32).at[starts].set(1))
  return span_num % 2 == 1, span_num


def _compact(values, keep, size: int):
  dest = jnp.where(keep, jnp.cumsum(keep) - 1, size)
  return jnp.zeros((size,), values.dtype).at[dest].set(values, mode="drop")


def corrupt(rng, tokens_L, segment_L, vocab_size: int, noise_density: float = 0.15, mean_span: float = 4.0,
            sentinels: int = 100):
  """One row -> dict of enc_tokens/enc_segment [Le], dec_inputs/targets/dec_segment [Lt].

  Sentinel ids are `vocab_size - 1 - k`; the spans of a row are numbered 0..s-1 and need
  s <= sentinels (checked statically)."""
  length = tokens_L.shape[0]
  n, s = counts(length, noise_density, mean_span)
  if s > sentinels:
    raise ValueError(f"{s} noise spans in a row of {length} tokens need more than {sentinels} sentinels")
  enc_len, tgt_len = length - n + s, n + s
  is_noise, span_num = noise_mask(rng, length, noise_density, mean_span)
  prev_noise = jnp.concatenate([jnp.zeros((1,), bool), is_noise[:-1]])
  sentinel = (vocab_size - 1 - span_num // 2).astype(tokens_L.dtype)

  keep_in = ~is_noise | ~prev_noise
  enc_tokens = _compact(jnp.where(is_noise, sentinel, tokens_L), keep_in, enc_len)
  enc_segment = _compact(segment_L, keep_in, enc_len)

  keep_tgt = is_noise | prev_noise | (jnp.arange(length) == 0)
  targets = _compact(jnp.where(is_noise, tokens_L, sentinel), keep_tgt, tgt_len)
  is_sent = _compact(~is_noise, keep_tgt, tgt_len)
  seg = _compact(segment_L, keep_tgt, tgt_len)
  # A sentinel announces the noise span after it (never the last target): take its document.
  dec_segment = jnp.where(is_sent, jnp.concatenate([seg[1:], seg[-1:]]), seg)
  start = jnp.asarray(vocab_size - 1 - sentinels, tokens_L.dtype)
  prev = jnp.concatenate([jnp.full((1,), start), targets[:-1]])
  prev_seg = jnp.concatenate([jnp.full((1,), -1, dec_segment.dtype), dec_segment[:-1]])
  dec_inputs = jnp.where(prev_seg == dec_segment, prev, start)
  return {"enc_tokens": enc_tokens, "enc_segment": enc_segment, "dec_inputs": dec_inputs,
          "targets": targets, "dec_segment": dec_segment}


def corrupt_batch(rng, tokens_BL, segment_BL, vocab_size: int, noise_density: float = 0.15,
                  mean_span: float = 4.0, sentinels: int = 100):
  """`corrupt` per row with independent keys."""
  keys = jax.random.split(rng, tokens_BL.shape[0])
  fn = lambda k, t, s: corrupt(k, t, s, vocab_size, noise_density, mean_span, sentinels)
  return jax.vmap(fn)(keys, tokens_BL, segment_BL)
