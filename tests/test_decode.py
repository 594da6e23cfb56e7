"""KV-cache generation equals recomputing the whole sequence, for standard and every SPS variant."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl import decode
from nsl.kernels import decode_cpu
from nsl.models import registry
from tests import hlo as hlo_text
from tests.helpers import random_params, tiny_config

PROMPT, NEW = 5, 9  # 14 tokens: the rings of w <= 3 wrap several times


def _family(variant, window, layout="stream_major", family="sps", init=True, rho="tied", scan=False):
  # vocab: the 257 byte ids + the <predict> row 257 (SPS's tied ρ), padded to a multiple of 8
  c = tiny_config("/nonexistent", **{"family": family, "model.variant": variant, "model.window": window,
                                     "model.attention_impl": "xla", "data.seq_len": 16, "model.vocab_size": 264,
                                     "model.scan_layers": scan})
  if family == "sps":
    c.sps.predict_embedding = rho
  c.sps.layout = layout
  fam = registry.get_family(c)
  if not init:
    return fam, None
  # std 0.06, sharper than the 0.02 of initialisation: greedy choices are not near-ties and windows matter
  return fam, random_params(fam, seed=1, std=0.06)


def _prompt(rows=2):
  return np.random.default_rng(0).integers(1, 257, (rows, PROMPT)).astype(np.int32)


# Each variant once (every case compiles its own prefill and decode loop): rings of w = 0 (none),
# 1 and 3, both prefill layouts; the standard family shares its compiled programs with the sps
# family's standard variant (same plan), which the window in the sps family does not touch.
# ρ is the tied embedding row by default; one case keeps the separate <predict> vector.
CASES = [("standard", 64, "stream_major", "sps", "tied"), ("sps", 0, "interleaved", "sps", "tied"),
         ("twox_memory", None, "stream_major", "sps", "tied"), ("delayed_state", 3, "stream_major", "sps", "tied"),
         ("reverse_sps", 1, "interleaved", "sps", "tied"), ("sps", 1, "stream_major", "sps", "separate")]


@pytest.mark.parametrize("variant,window,layout,family,rho", CASES)
def test_cached_generation_equals_full_recomputation(variant, window, layout, family, rho):
  fam, params = _family(variant, window, layout, family, rho=rho)
  assert "block_0" in params["trunk"]  # unrolled storage; prefill scans over layers, the token loop unrolls them
  _check_generation(fam, params)


def test_cached_generation_with_scanned_parameters():
  """A trunk stored scanned (`trunk/layers`, stacked) decodes through the same cached path."""
  fam, params = _family("delayed_state", 2, "stream_major", scan=True)
  assert "layers" in params["trunk"]
  _check_generation(fam, params)


def _check_generation(fam, params):
  prompt = _prompt()
  toks, logits = decode.generate(fam, params, prompt, NEW)
  ref_toks, ref_logits = decode.generate_uncached(fam, params, prompt, NEW)
  assert toks.shape == (2, NEW) and logits.shape == (2, NEW, 264)
  np.testing.assert_array_equal(toks, ref_toks)
  np.testing.assert_allclose(logits, ref_logits, atol=1e-4)


@pytest.mark.parametrize("variant,window,layout,family", [("standard", None, "stream_major", "standard"),
                                                          ("sps", 0, "interleaved", "sps")])
def test_temperature_sampling_equals_full_recomputation(variant, window, layout, family):
  fam, params = _family(variant, window, layout, family=family)
  prompt = _prompt()
  toks, _ = decode.generate(fam, params, prompt, NEW)
  key = jax.random.PRNGKey(7)
  s_toks, s_logits = decode.generate(fam, params, prompt, NEW, temperature=1.0, rng=key)
  r_toks, r_logits = decode.generate_uncached(fam, params, prompt, NEW, temperature=1.0, rng=key)
  np.testing.assert_array_equal(s_toks, r_toks)
  np.testing.assert_allclose(s_logits, r_logits, atol=1e-4)
  assert not np.array_equal(s_toks, toks)  # sampling is not greedy


def test_window_matters_so_the_ring_is_exercised():
  """The same parameters under w = 0 and w >= T give different logits: the equality above is not
  vacuous, what leaves the ring is no longer attended."""
  fam1, params = _family("sps", 0, "interleaved")
  fam2, _ = _family("twox_memory", None)
  _, l1 = decode.generate(fam1, params, _prompt(), NEW)
  _, l2 = decode.generate(fam2, params, _prompt(), NEW)
  assert np.abs(np.asarray(l1) - np.asarray(l2))[:, 1:].max() > 1e-3


@pytest.mark.parametrize("variant,window,slots", [("standard", None, 20), ("sps", 3, 23), ("delayed_state", 3, 23),
                                                  ("reverse_sps", 0, 20), ("twox_memory", None, 40)])
def test_cache_sizes(variant, window, slots):
  """Per layer and row: T slots for standard, T + w for sps / delayed / reverse, 2T for 2x memory."""
  fam, _ = _family(variant, window, init=False)
  cache = decode.init_cache(fam.dims, fam.slot_plan(), batch=2, max_tokens=20)
  assert cache.size == cache.k.shape[4] == cache.v.shape[3] == slots  # K [L, B, H, Dh, S], V [L, B, H, S, Dh]
  per_slot = 2 * fam.dims.n_layers * 2 * fam.dims.d_model * 4  # K and V, layers, rows, float32
  assert decode.cache_bytes(cache)["persistent"] + decode.cache_bytes(cache)["ring"] == slots * per_slot
  assert decode.cache_bytes(cache)["ring"] == (window or 0) * per_slot * (variant not in ("standard", "twox_memory"))


def test_single_stream_families_share_the_standard_trunk():
  """NextLat/MTP and LIFT subclass the standard LM: the same `embed` / `trunk` parameter tree
  (so one cached decoder reads all of them) and the same hidden states from the same weights."""
  import os

  from nsl import config as config_lib
  from nsl.models import transformer

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  std, params = _family("standard", None, family="standard")
  toks = jnp.asarray(_prompt())
  ref = std.model.apply({"params": params}, toks, jnp.ones_like(toks), method="hidden")
  for spec in ("nextlat.py:nextlat_tiny", "nextlat.py:mtp_tiny", "lift.py:lift_tiny"):
    c = config_lib.load_config(os.path.join(root, "configs", spec))
    c.model.update({k: std.config.model.get(k) for k in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff",
                                                         "mup_base_width", "window")})
    c.model.update(tie_embeddings=True, scaled_out_init=True)  # the standard trunk's (NextLat's configs untie)
    fam = registry.get_family(c)
    assert isinstance(fam.model, transformer.LM)
    shapes = nn.unbox(jax.eval_shape(fam.init, jax.random.PRNGKey(0)))
    for part in ("embed", "trunk"):
      assert jax.tree.map(lambda s: s.shape, shapes[part]) == jax.tree.map(lambda a: a.shape, params[part])
    if c.family == "nextlat":
      h = fam.model.apply({"params": {**params, "dynamics": jax.tree.map(jnp.zeros_like, shapes["dynamics"])}},
                          toks, jnp.ones_like(toks), method="hidden")
      np.testing.assert_allclose(h, ref, atol=1e-5)


def test_unrolled_stack_takes_the_cache_like_the_scanned_one():
  """`layers.Stack` with `block_i` parameters runs the cached call as a Python loop over its
  blocks; it writes the same cache and returns the same states as the scanned decoder path."""
  from nsl.nn import layers

  fam, params = _family("standard", None, family="standard")
  dims, plan = fam.dims, fam.slot_plan()
  assert not dims.scan_layers
  x = decode._embed(dims, params, plan, jnp.asarray(_prompt()))[:, :, 0]
  cache = decode.init_cache(dims, plan, 2, 8)
  ar = jnp.arange(PROMPT, dtype=jnp.int32)
  step = cache.step(ar, ar, jnp.zeros_like(ar), jnp.ones((2, PROMPT), jnp.int32))
  c1, h1 = layers.Stack(dims, plan.rule).apply({"params": params["trunk"]}, x, None, cache=cache, step=step)
  c2, h2 = decode.trunk(dims, plan.rule, params, x, cache, step)
  np.testing.assert_allclose(h1, h2, atol=1e-5)
  np.testing.assert_allclose(c1.k, c2.k, atol=1e-5)
  np.testing.assert_array_equal(c1.segment, c2.segment)
  assert float(jnp.abs(c1.k[..., :PROMPT]).min()) > 0 and float(jnp.abs(c1.k[..., PROMPT:]).max()) == 0
  # The per-layer form (the token loop's): the same states and, restacked, the same cache.
  c3, h3 = decode.trunk(dims, plan.rule, decode.token_loop_params(dims, params), x, cache.per_layer(), step)
  assert c3.is_per_layer and len(c3.k) == dims.n_layers and c3.size == cache.size
  np.testing.assert_allclose(h3, h2, atol=1e-5)
  np.testing.assert_allclose(c3.stacked().k, c2.k, atol=1e-5)
  np.testing.assert_allclose(c3.stacked().v, c2.v, atol=1e-5)
  assert c3.nbytes() == c2.nbytes()


def _compiled_decode_loop(variant="standard", window=None, family="standard"):
  """(XLA's compiled text of `decode_loop` after a prefill, the cache it decodes with)."""
  fam, params = _family(variant, window, family=family)
  dims, plan = fam.dims, fam.slot_plan()
  logits, cache = decode.prefill_jit(dims, plan, params, jnp.asarray(_prompt()), PROMPT + NEW)
  hlo = decode.decode_loop.lower(dims, plan, params, cache, logits, NEW, jnp.float32(0), jnp.int32(PROMPT),
                                 jax.random.PRNGKey(0)).compile().as_text()
  return hlo, cache


@pytest.mark.parametrize("variant,window,family", [("standard", None, "standard"), ("sps", 3, "sps")])
def test_decode_loop_copies_no_cache_inside_its_loops(variant, window, family):
  """The token loop runs on the cache's per-layer form (`KVCache.per_layer`) and each layer's
  K/V write is ordered after that layer's reads (`write_kv(after=...)`): inside the compiled
  loop no whole cache and no layer's K or V buffer is copied; the per-layer split happens once,
  in the entry, and the loop returns the per-layer form (no restacking copy). (Scattering into the full cache through the layer scan
  copied it twice per layer; unordered per-layer writes copied each layer's buffer twice per
  token: an XS decode step 1.4x resp. 1.8x slower.) SPS writes two entries per layer (x_i's
  persistent one, ρ_i's in the ring), one in-place update each, still without a copy."""
  hlo, cache = _compiled_decode_loop(variant, window, family)
  shapes = {hlo_text.shape(a) for a in (cache.k.shape, cache.v.shape, cache.k.shape[1:], cache.v.shape[1:])}
  in_loop = hlo_text.copies_outside_entry(hlo, shapes)
  assert "while" in hlo and not in_loop, in_loop


@pytest.fixture
def without_the_kernel(monkeypatch):
  """The decode loops as compiled where `nsl.kernels.decode_cpu` does not apply (no compiler,
  bfloat16, another head dim): XLA's attention and cache updates."""
  monkeypatch.setattr(decode_cpu, "supports", lambda *a: False)
  jax.clear_caches()  # the jitted decode loop was traced with the kernel by the tests before
  yield
  jax.clear_caches()


def _decode_attention_calls(hlo, target="nsl_decode_cpu_write"):
  """The q shapes [B, Q, H, Dh] of the compiled loop's `nsl.kernels.decode_cpu` calls."""
  return [re.match(r"\S+ = \((f32\[[\d,]*\])", line).group(1) for lines in hlo_text.computations(hlo)[0].values()
          for line in lines if f'custom_call_target="{target}"' in line]


def _check_layer_slices(variant, window, family, kernel: bool):
  hlo, cache = _compiled_decode_loop(variant, window, family)
  k_l, v_l = cache.k.shape[1:], cache.v.shape[1:]
  big = hlo_text.large_values_in_loops(hlo, int(np.prod(k_l)))
  n_layers = cache.k.shape[0]
  if kernel:  # each layer's reads and writes are one kernel call on its buffers, in place
    assert big == [] and len(_decode_attention_calls(hlo)) == n_layers, big
    return
  assert set(big) <= {hlo_text.shape(k_l), hlo_text.shape(v_l)}, sorted(set(big))
  writes = n_layers * len(cache.kinds)  # a step writes every slot of its group, in every layer
  assert big.count(hlo_text.shape(k_l)) == big.count(hlo_text.shape(v_l)) == writes, big


@pytest.mark.parametrize("variant,window,family", [("standard", None, "standard"), ("sps", 3, "sps")])
def test_decode_attention_reads_each_layer_slice_as_stored(variant, window, family):
  """Inside the compiled decode loop nothing as large as one layer's K or V is made: each layer's
  attention reads its cache buffers in place and writes the step's K/V into them in the same
  `nsl.kernels.decode_cpu` call (on the CPU). The new slots' keys are scored apart, not
  concatenated to the cache, and no layer's K/V is transposed or sliced out of a stacked array (a
  slot-major cache concatenated with the new keys made XLA transpose-copy every layer's K and V
  on every token, ~70% of an XS decode step on CPU; a layer scan copied each layer's weights and
  K/V slices; the one- and the two-slot (SPS) step alike)."""
  _check_layer_slices(variant, window, family, kernel=True)


@pytest.mark.parametrize("variant,window,family", [("standard", None, "standard"), ("sps", 3, "sps")])
def test_decode_attention_without_the_kernel_updates_each_layer_in_place(variant, window, family, without_the_kernel):
  """Without the kernel the only arrays as large as one layer's K or V are XLA's in-place updates,
  one of K and one of V per written slot and layer (SPS writes x_i's persistent entry and ρ_i's
  ring entry: two dynamic-update-slices, not a scatter, which XLA:CPU runs element by element)."""
  _check_layer_slices(variant, window, family, kernel=False)


def test_sps_decode_step_computes_the_head_for_the_read_out_slot_only():
  """A decoded SPS token is two slots (x, ρ) through the trunk, but only ρ's logits are read: the
  compiled decode loop has one vocabulary-wide product, over the B rows (not B x 2 slots)."""
  hlo, _ = _compiled_decode_loop("sps", 3, "sps")
  comps, _ = hlo_text.computations(hlo)
  made = [hlo_text.made(line) for lines in comps.values() for line in lines]
  heads = [kind for kind, op in made if op == "dot" and kind.endswith(",264]")]  # over the test model's vocabulary
  assert heads == ["f32[2,264]"], heads


def test_sps_decode_step_runs_the_last_layer_for_the_read_out_slot_only():
  """Nothing reads the x slot's output of the last layer (only its K/V, written there), so the
  compiled SPS step runs that layer's queries and MLP on the B read-out rows and every other
  layer's on the B x 2 slots. On the CPU each layer's cached attention is one
  `nsl.kernels.decode_cpu` call that reads the layer's K/V once for both of its queries (XLA read
  them once per query: 1.4 ms a layer at XS against 0.7 ms for the standard model's one)."""
  hlo, cache = _compiled_decode_loop("sps", 3, "sps")
  fam, _ = _family("sps", 3, init=False)
  n, b, h, f, dh = fam.dims.n_layers, cache.k.shape[1], fam.dims.n_heads, fam.dims.d_ff, fam.dims.head_dim
  comps, _ = hlo_text.computations(hlo)
  products = [hlo_text.made(line)[0] for lines in comps.values() for line in lines  # XLA's or decode_cpu.matmul
              if hlo_text.made(line)[1] == "dot" or 'custom_call_target="nsl_decode_matmul_cpu"' in line]
  mlp_in = sorted(kind for kind in products if kind.startswith("f32[") and kind.endswith(f",{f}]"))
  assert mlp_in == sorted([hlo_text.shape((b, f))] * 2 + [hlo_text.shape((2 * b, f))] * 2 * (n - 1)), mlp_in
  assert decode_cpu.supports(jnp.zeros((b, 2, h, dh)), cache.k[0])  # the test model's shapes take the kernel here
  assert sorted(_decode_attention_calls(hlo)) == sorted([hlo_text.shape((b, 2, h, dh))] * (n - 1)
                                                        + [hlo_text.shape((b, 1, h, dh))])


def test_sps_decode_attention_without_the_kernel_scores_each_query_as_a_gemv(without_the_kernel):
  """Where the CPU kernel does not apply, each query scores the cached keys as its own
  matrix-vector product: XLA:CPU's two-row product was ~2x slower at XS (`kv_cache.GEMV_QUERIES`)."""
  hlo, cache = _compiled_decode_loop("sps", 3, "sps")
  n, b, h = cache.k.shape[0], cache.k.shape[1], cache.k.shape[2]
  dots = [hlo_text.made(line)[0] for lines in hlo_text.computations(hlo)[0].values() for line in lines
          if hlo_text.made(line)[1] == "dot"]
  assert not _decode_attention_calls(hlo) and not _decode_attention_calls(hlo, "nsl_decode_cpu")
  assert dots.count(hlo_text.shape((b, h, 1, cache.size))) == 2 * n - 1, dots


def test_decode_loop_writes_the_returned_logits_in_place():
  """`decode_loop` returns every step's logits [B, steps, V]; the token loop writes them into that
  buffer (a loop carry): the compiled program makes one such buffer before the loop and no
  stacked [steps - 1, B, V] scan output to transpose-copy after it (206 MB at XS, 128 tokens)."""
  hlo, cache = _compiled_decode_loop()
  comps, entry = hlo_text.computations(hlo)
  b, v = cache.k.shape[1], 264
  made = [hlo_text.made(line) for lines in comps.values() for line in lines]
  assert not [m for m in made if m[0] == hlo_text.shape((NEW - 1, b, v))], "a stacked logits output"
  in_entry = [op for kind, op in map(hlo_text.made, comps[entry]) if kind == hlo_text.shape((b, NEW, v))]
  assert len([op for op in in_entry if op not in ("get-tuple-element", "bitcast", "copy")]) == 1, in_entry


def test_greedy_decoding_draws_no_random_bits():
  """`sample` draws its Gumbel noise (B x V random bits a token) in a `lax.cond` branch taken only
  when temperature > 0: outside the conditionals' branches no computation makes [B, V] bits."""
  hlo, _ = _compiled_decode_loop()
  comps, _ = hlo_text.computations(hlo)
  branches = set().union(*(hlo_text.called(lines, ("branch_computations",)) for lines in comps.values()))
  reach, todo = set(), list(branches)
  while todo:  # every computation a branch runs (its loops, fusions, ...)
    name = todo.pop()
    if name not in reach:
      reach.add(name)
      todo.extend(hlo_text.called(comps.get(name, [])))
  bits = "u32[2,264]"  # rows x vocabulary (the test model's)
  made = lambda lines: any(hlo_text.made(line)[0] == bits
                           and hlo_text.made(line)[1] not in ("parameter", "get-tuple-element") for line in lines)
  assert any(made(comps[n]) for n in reach)  # the sampling branch makes them
  outside = [n for n, lines in comps.items() if n not in reach and made(lines)]
  assert branches and not outside, outside


def test_a_family_without_this_decoder_is_a_config_error():
  from nsl.errors import ConfigError
  from nsl.models.family import Family

  fam, _ = _family("standard", None, family="standard", init=False)
  with pytest.raises(ConfigError, match="no KV-cache slot plan") as err:
    Family.slot_plan(fam)  # the base class's: a model that is not the standard trunk
  assert "\n" not in str(err.value)


@pytest.mark.parametrize("v", [264, 50304, 100])
def test_argmax_is_jnp_argmax(v):
  """`decode.argmax` (two levels of chunks) returns jnp.argmax's index: the first maximum, ties
  across and inside chunks, a NaN (the first one), a row of -inf, a vocabulary off the chunk."""
  rng = np.random.default_rng(v)
  x = rng.normal(size=(7, v)).astype(np.float32)
  x[1, [3, v - 1]] = 9.0  # a tie across chunks
  x[2, [v // 2, v // 2 + 1]] = 9.0  # a tie inside a chunk
  x[3, [5, v - 2]] = np.nan
  x[4] = -np.inf
  x[5] = np.round(x[5])  # many ties
  x[6, v - 1] = 50.0  # the last entry (the padded chunk when v is off the chunk)
  got = jax.jit(decode.argmax)(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))
  assert got.dtype == jnp.int32
