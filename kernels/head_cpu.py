"""The tied head and its cross-entropy on the CPU in one C++ XLA FFI call (`head_cpu.cc`).

`nsl.nn.cross_entropy.head_cross_entropy` runs this (the kernel registry's `head_cpu` entry) on a
single-device CPU computation whenever d_model and the vocabulary are multiples of the kernel's
panel width (16 with AVX2, 64 with AVX-512; the GPT-2 vocabulary of 50,304 is both), and its
chunked XLA scan otherwise (a mesh of several devices included: the call is opaque to the
partitioner; `model.cpu_kernels=False` too). Same contract: the weighted mean
NLL and the weight sum, the gradients of h and E formed in the forward pass (the loss ends the
graph; the custom VJP only scales them). Math and schedule: `head_cpu.cc`'s docstring.

Why: the 50k-way head is ~78% of a small model's FLOPs per token; XLA:CPU runs the scan's dots at
~80 GFLOP/s on 2 cores (head + loss forward and backward at 2048 rows), the kernel keeps its
products in the register-blocked micro-kernel (docs/benchmarks.md#profiles).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

from nsl.kernels import cpu_build
from nsl.kernels.common import head_with_forward_grads, one_cpu_device

TARGET = "nsl_head_cpu"  # registered by cpu_build


def available() -> bool:
  """Whether the kernel library builds and loads here (the registry's availability check)."""
  return cpu_build.load() is None


def panel_width() -> int | None:
  """The width d_model and the vocabulary must be multiples of; None when the kernel is unavailable."""
  return cpu_build.constant("NslHeadCpuPanelWidth")


def supports(h_ND, embedding_VD) -> bool:
  """Whether `cross_entropy` takes this head: a CPU computation on one device, floating inputs,
  d_model and vocabulary multiples of `panel_width()`."""
  if not one_cpu_device():
    return False
  if not (jnp.issubdtype(h_ND.dtype, jnp.floating) and jnp.issubdtype(embedding_VD.dtype, jnp.floating)):
    return False
  pw = panel_width()
  v, d = embedding_VD.shape
  return pw is not None and d % pw == 0 and v % pw == 0 and h_ND.shape[1] == d


def cross_entropy(h_ND, embedding_VD, targets_N, weights_N, scale: float = 1.0):
  """Weighted mean NLL of `scale · h Eᵀ` and the weight sum (`cross_entropy.head_cross_entropy`'s contract)."""
  if (reason := cpu_build.load()) is not None:
    raise RuntimeError(f"the CPU head kernel is unavailable: {reason}")
  return _head(h_ND, embedding_VD, targets_N, weights_N, float(scale))


def _call(h_ND, embedding_VD, targets_N, weights_N, scale, grads: bool):
  n, d = h_ND.shape
  weight = jnp.sum(weights_N.astype(jnp.float32))
  inv_w = 1.0 / jnp.maximum(weight, 1.0)
  coef = weights_N.astype(jnp.float32) * (inv_w * scale)
  out = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  shapes = (out(n), out(n, d), out(*embedding_VD.shape)) if grads else (out(n), out(0), out(0))
  call = jax.ffi.ffi_call(TARGET, shapes, vmap_method="sequential")
  nll, d_h, d_e = call(h_ND.astype(jnp.float32), embedding_VD.astype(jnp.float32),
                       targets_N.astype(jnp.int32), coef, scale=np.float32(scale), grads=np.int64(grads))
  loss = jnp.sum(nll * weights_N.astype(jnp.float32)) * inv_w
  return loss, weight, d_h, d_e


_head = head_with_forward_grads(_call)
