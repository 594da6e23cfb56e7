"""The next-token objective every family trains on: targets and weights of a packed batch
(`next_token_targets`, docs/papers/sps.md#loss), the weighted mean NLL of logits
(`masked_cross_entropy`), and the tied head fused with it (`head_cross_entropy`: a chunked linear +
cross-entropy, or the C++ kernel `nsl.kernels.head_cpu` on one CPU device, as the kernel registry
picks)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from nsl.kernels import head_cpu, registry
from nsl.kernels.common import head_with_forward_grads


def next_token_targets(batch: dict[str, Any]):
  """Inputs, targets and loss weights of a packed batch of `seq_len + 1` tokens.

  A target counts iff input and target are in the same document and not padding (segment 0):
  the target after an EOS (the next document's first token) is ignored (docs/papers/sps.md#loss).

  Labelled task data (a batch with `labels`, aligned with `tokens`, -1 = none; see
  nsl/data/tasks): the target of input i is `labels[i]` instead of the next token, counted iff
  it is >= 0 and not padding.
  """
  tokens, segment = batch["tokens"], batch["segment"]
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  seg_in, seg_tgt = segment[:, :-1], segment[:, 1:]
  if "labels" in batch:
    labels = batch["labels"][:, :-1]
    weights = ((labels >= 0) & (seg_in > 0)).astype(jnp.float32)
    return inputs, jnp.maximum(labels, 0), seg_in, weights
  weights = ((seg_in == seg_tgt) & (seg_in > 0)).astype(jnp.float32)
  return inputs, targets, seg_in, weights


def masked_cross_entropy(logits_BTV, targets_BT, weights_BT):
  """Mean next-token NLL over weighted targets, and the weight (token count) it averages over."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
  weight = jnp.sum(weights_BT)
  return jnp.sum(ce * weights_BT) / jnp.maximum(weight, 1.0), weight


# Rows of a head + cross-entropy chunk: one [rows, V] block of logits at a time (50,304 × 1024 ×
# 4 B = 206 MB at the GPT-2 vocabulary) instead of all B·T rows; 512 and 2048 measured within
# noise of it (2 cores, head + loss forward + backward alone).
HEAD_CHUNK_ROWS = 1024


def head_cross_entropy(h_ND, embedding_VD, targets_N, weights_N, scale: float = 1.0):
  """Weighted mean NLL of logits `scale · h Eᵀ` over N rows, and the weight sum (as
  `masked_cross_entropy`), with the tied head and the softmax computed one chunk of rows at a
  time and the gradients of h and E formed in the same pass (a fused linear + cross-entropy).

  Why: the logits path materialises [N, V] float32 buffers (`strace` at 8 × 1024 tokens: a 3.3 GB
  temporary mapped and unmapped per step); measured forward + backward of head and loss alone on 2
  cores: 3-7% faster at 2048 rows, 7-14% at 8192 rows (docs/benchmarks.md#current).
  The gradient of the mean NLL with respect to the logits is (softmax − onehot) · w / Σw, known
  in the forward pass because the loss ends the graph; the backward pass only scales it.
  `targets` and `weights` are data: no gradient flows to them (zeros).

  On a single-device CPU computation the C++ kernel `nsl.kernels.head_cpu` runs it (same contract,
  1.2-1.4× faster than this scan on 2 cores at 2048 × 50,304; docs/benchmarks.md#profiles) wherever
  the kernel registry picks it (`head_cpu.supports`; not under `model.cpu_kernels=False`)."""
  if registry.pick_call("head", h_ND, embedding_VD) == "head_cpu":
    return head_cpu.cross_entropy(h_ND, embedding_VD, targets_N, weights_N, scale)
  return _head_ce(h_ND, embedding_VD, targets_N, weights_N, scale)


def _head_ce_parts(h_ND, embedding_VD, targets_N, weights_N, scale, grads: bool = True):
  """(loss, weight, dloss/dh, dloss/dE); without `grads` only the first two (one matmul a chunk)."""
  n, d = h_ND.shape
  rows = min(HEAD_CHUNK_ROWS, n)
  pad = -n % rows  # padded rows carry weight 0: no loss, no gradient
  if pad:
    h_ND, targets_N, weights_N = (jnp.pad(a, [(0, pad)] + [(0, 0)] * (a.ndim - 1)) for a in (h_ND, targets_N, weights_N))
  weight = jnp.sum(weights_N)
  inv_w = 1.0 / jnp.maximum(weight, 1.0)
  e_f32 = embedding_VD.astype(jnp.float32)

  def chunk(d_e, xs):
    h, t, w = xs
    logits = jnp.dot(h.astype(jnp.float32), e_f32.T, preferred_element_type=jnp.float32) * scale
    m = jnp.max(logits, axis=-1, keepdims=True)
    ex = jnp.exp(logits - m)
    total = jnp.sum(ex, axis=-1, keepdims=True)
    nll = (m + jnp.log(total))[:, 0] - jnp.take_along_axis(logits, t[:, None], axis=1)[:, 0]
    if not grads:
      return d_e, (jnp.sum(nll * w), None)
    g = (ex / total - jax.nn.one_hot(t, logits.shape[-1], dtype=jnp.float32)) * (w * inv_w * scale)[:, None]
    return d_e + g.T @ h.astype(jnp.float32), (jnp.sum(nll * w), g @ e_f32)

  chunks = (n + pad) // rows
  xs = (h_ND.reshape(chunks, rows, d), targets_N.reshape(chunks, rows), weights_N.reshape(chunks, rows))
  d_e, (nll_sums, d_h) = jax.lax.scan(chunk, jnp.zeros_like(e_f32) if grads else None, xs)
  loss = jnp.sum(nll_sums) * inv_w
  return (loss, weight, d_h.reshape(n + pad, d)[:n], d_e) if grads else (loss, weight, None, None)


_head_ce = head_with_forward_grads(_head_ce_parts)
