"""What the bit-for-bit training tests share (docs/guide/determinism.md): a tiny config that the
default CPU kernels take, a check that the compiled step really runs them, and a run's outcome
with its timings left out (everything else must be the same bits)."""

from __future__ import annotations

import json
import os

import jax

from tests.helpers import tiny_config

# tests.helpers.tiny_config's model, widened to what the C++ kernels take on AVX2 and AVX-512 hosts
# alike (d_model and the vocabulary multiples of 64; head dim 32): attention and the head + loss
# run in the kernels, as on a user's CPU. The vocabulary (padded past the byte tokenizer's 257) is
# 9 of the head kernel's chunks, so its tasks are spread over the workers differently from call to
# call: with 2 chunks the old per-worker gradient partials (issue #42) happened to split the same
# way every time and two runs agreed.
KERNEL_OVERRIDES = {"model.d_model": 64, "model.vocab_size": 8 * 256 + 64}
KERNEL_TARGETS = ("nsl_flash_cpu_fwd", "nsl_flash_cpu_bwd", "nsl_head_cpu")
# Timing fields: the only ones two runs of the same bits may disagree on.
TIMING = {"tokens_per_sec", "tflops_per_device", "mfu", "wall_time_sec", "cpu_time_sec"}


def kernel_config(data_dir: str, **overrides):
  return tiny_config(data_dir, **{**KERNEL_OVERRIDES, **overrides})


def one_device():
  """The test process has 8 fake CPU devices (tests/conftest.py); a user's CPU is one, and only
  there does `auto` pick every kernel (the head's is a single-device call)."""
  return jax.devices()[:1]


def assert_default_kernels(program) -> None:
  """The compiled train step calls the C++ kernels: a test of bits must not silently test XLA."""
  if jax.default_backend() != "cpu":
    return
  from nsl.kernels import cpu_build
  assert cpu_build.load() is None, f"the CPU kernels did not build: {cpu_build.load()}"
  text = program.lower_train().as_text()
  missing = [t for t in KERNEL_TARGETS if t not in text]
  assert not missing, f"the train step does not call {missing}: auto picked XLA"


def metrics(workdir) -> list[dict]:
  """metrics.jsonl without its timing fields."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f]


def result(workdir) -> dict:
  """result.json without its timing fields (state_sha256 included)."""
  with open(os.path.join(workdir, "result.json")) as f:
    return {k: v for k, v in json.load(f).items() if k not in TIMING}
