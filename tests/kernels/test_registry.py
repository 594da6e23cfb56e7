"""`nsl.kernels.registry`: one entry per backend; `auto`, the CPU head and decode kernels choose
through it; `model.cpu_kernels=False` leaves every C++ CPU kernel out of the traced train step and
of a decode step; `Program.describe` reports what was picked."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError
from nsl.kernels import cpu_build, registry
from nsl.nn import attention, cross_entropy, kv_cache, layers, masks
from nsl.models import double_decoder
from tests.kernels import kernel_cases as kc
from tests.train.bitwise import KERNEL_TARGETS, assert_default_kernels, kernel_config, one_device

CPU_TARGETS = KERNEL_TARGETS + ("nsl_decode_cpu", "nsl_decode_cpu_write", "nsl_decode_matmul_cpu")
CASES = kc.make_cases(32)


def cpu_calls(text: str) -> list[str]:
  """The C++ CPU kernels a lowered program calls."""
  return [t for t in CPU_TARGETS if f"@{t}(" in text]


def test_each_kind_has_one_fallback_and_attention_impl_names_are_the_attention_keys():
  assert attention.IMPLS == ("auto",) + registry.names("attention")
  assert set(registry.names("attention")) == {"splash", "cudnn", "pallas_gpu", "flash_cpu", "chunked", "xla"}
  assert [registry.fallback_name(k) for k in registry.KINDS] == ["chunked", "xla", "xla", "xla"]
  assert {b.name for k in registry.KINDS for b in registry.backends(k) if b.cpu_kernel} == {
      "flash_cpu", "head_cpu", "decode_cpu"}
  with pytest.raises(ValueError, match="registered twice"):
    registry.register(registry.Backend("head", "xla", "again"))


def test_a_rule_outside_the_declared_ones_is_never_supported():
  """The declared rules only restate what each kernel's shape check refuses, so filtering on
  them first changes no choice (`auto_choice` asks `takes_rule`, then `supports`)."""
  refused = 0
  for case in CASES:
    for b in registry.backends("attention"):
      if b.module is None or b.takes_rule(case.rule):
        continue
      refused += 1
      dtype = jnp.bfloat16 if b.name == "cudnn" else jnp.float32
      q, k, v = kc.qkv(case, 2, 16, dtype=dtype)
      assert not b.supports(q, k, v, case.rule, case.q_slots, case.k_slots, block_q=16, block_k=16), (b.name, case.name)
  assert refused >= 4  # the block rules: splash (earlier), cudnn and flash_cpu (both)


def test_the_general_kernel_per_platform_and_the_cpu_switch(monkeypatch):
  everywhere = lambda b: not (b.cpu_kernel and not registry.cpu_kernels())  # a host with every device
  assert [registry.general("attention", p, everywhere) for p in ("tpu", "gpu", "cpu")] == [
      "splash", "pallas_gpu", "flash_cpu"]
  with registry.use(cpu_kernels=False):
    assert registry.general("attention", "cpu", everywhere) == "chunked"
    assert attention.resolve_impl("auto") == "chunked"
    with pytest.raises(ConfigError, match="cpu_kernels"):
      registry.require("attention", "flash_cpu")
  assert registry.cpu_kernels()


def test_a_kernel_named_for_a_rule_it_cannot_take_runs_chunked():
  cross = double_decoder.CROSS_RULE
  assert [double_decoder.cross_impl(i) for i in ("auto", "splash", "cudnn", "flash_cpu", "pallas_gpu", "xla")] == [
      "auto", "chunked", "chunked", "chunked", "pallas_gpu", "xla"]
  assert attention.impl_for("splash", masks.Rule()) == "splash"
  with pytest.raises(ConfigError, match="attention_impl"):
    attention.impl_for("magic", cross)


def test_records_see_picks_and_named_choices_nested():
  case = CASES[0]
  q, k, v = kc.qkv(case, 2, 16)
  with registry.record() as outer:
    attention.attend(q, k, v, case.rule, case.q_slots, case.k_slots, impl="xla")
    with registry.record() as inner:
      with registry.use(cpu_kernels=False):
        attention.attend(q, k, v, case.rule, case.q_slots, case.k_slots)
  assert inner.summary() == {"attention": "chunked"}
  assert outer.summary() == {"attention": "xla+chunked"}


def test_config_checks_the_switch_and_names_the_registry():
  c = kernel_config("/nonexistent")
  c.model.attention_impl = "magic"
  with pytest.raises(ConfigError, match="'flash_cpu', 'xla', 'chunked'"):
    nsl_config.validate(c)
  c.model.attention_impl, c.model.cpu_kernels = "flash_cpu", False
  with pytest.raises(ConfigError, match="cpu_kernels=False"):
    nsl_config.validate(c)
  c.model.attention_impl = "auto"
  nsl_config.validate(c)
  assert "model.cpu_kernels" in nsl_config.RESUME_MAY_CHANGE


@pytest.fixture(scope="module")
def programs():
  """The train step of the bit-for-bit tests' tiny model (one CPU device) with the CPU kernels on
  and off, its lowered text and `describe()`."""
  from nsl.train import program as program_lib
  out = {}
  for on in (True, False):
    p = program_lib.Program(kernel_config("/nonexistent", **{"model.cpu_kernels": on}), one_device())
    out[on] = (p, p.lower_train().as_text(), p.describe())
  return out


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU kernels run on a CPU host")
def test_the_switch_leaves_every_cpu_kernel_out_of_the_train_step(programs):
  program, _, described = programs[True]
  assert_default_kernels(program)
  assert described["kernels"] == {"attention": "flash_cpu", "head": "head_cpu", "matmul": "xla"}
  _, text, described = programs[False]
  assert cpu_calls(text) == []
  assert described["attention_impl"] == "chunked" and described["kernels"]["head"] == "xla"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU kernels run on a CPU host")
def test_the_switch_leaves_the_decode_kernels_out_of_a_decode_step():
  """A decode step's cached attention (with its in-place write) and its few-row products."""
  assert cpu_build.load() is None, cpu_build.load()
  dims = layers.Dims(vocab_size=64, d_model=64, n_layers=1, n_heads=2, d_ff=64)
  cache = kv_cache.KVCache.create(dims, batch=2, max_tokens=8).per_layer()

  def step(cache, q, k, v, w):
    s = cache.step(jnp.array([3]), jnp.array([3]), jnp.array([masks.PERSISTENT]), jnp.ones((2, 1), jnp.int32))
    cache, out = cache.attend_write(q, k, v, masks.Rule(), s, 0)
    return cache, layers.dense(out.reshape(2, -1), w)

  args = (cache, *(jnp.ones((2, 1, 2, 32)) for _ in range(3)), jnp.ones((64, 64)))
  text = lambda: jax.jit(step).lower(*args).as_text()
  assert cpu_calls(text()) == ["nsl_decode_cpu_write", "nsl_decode_matmul_cpu"]
  with registry.use(cpu_kernels=False):
    assert cpu_calls(text()) == []


def test_the_head_follows_the_switch():
  h, e = jnp.ones((8, 64)), jnp.ones((128, 64))
  t, w = jnp.zeros((8,), jnp.int32), jnp.ones((8,))
  lowered = lambda: jax.jit(lambda h, e: cross_entropy.head_cross_entropy(h, e, t, w)[0]).lower(h, e).as_text()
  with registry.record() as picks:
    on = lowered()
    with registry.use(cpu_kernels=False):
      off = lowered()
  assert cpu_calls(on) == (["nsl_head_cpu"] if jax.default_backend() == "cpu" else []) and cpu_calls(off) == []
  assert picks.chosen["head"] == (["head_cpu", "xla"] if cpu_calls(on) else ["xla"])


def test_a_run_trained_without_the_cpu_kernels_is_read_without_them(tmp_path):
  """`runs.load_run` (generation, evaluations, decoding benchmarks) sets the run's switch for the
  process, so its readers trace what it trained with."""
  from nsl import runs
  from nsl.train import loop
  from tests.helpers import make_corpus, tiny_config

  data = make_corpus(str(tmp_path / "corpus"), n=4, chars=2000)
  workdir = str(tmp_path / "run")
  overrides = {"train.steps": 2, "train.warmup_steps": 1, "train.decay_steps": 1, "model.cpu_kernels": False}
  loop.Trainer(tiny_config(data, **overrides), workdir, progress=False).run()
  try:
    assert registry.cpu_kernels()
    runs.load_run(workdir)
    assert not registry.cpu_kernels()
  finally:
    registry.set_default(True)
