"""SPS family: the mask against REFERENCES §1 read pair by pair, layouts, read-out, FLOPs, configs."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError
from nsl.models import registry, sps
from nsl.models.transformer import StandardFamily
from nsl.train import loop
from tests.helpers import ROOT, random_params, tiny_config

# REFERENCES §1, variant table: (x slot, ρ slot); "P" = persistent, "W" = windowed (temporary).
# 2x memory is "sps with w >= T (every ρ stays persistent)".
TABLE = {"sps": ("P", "W"), "twox_memory": ("P", "P"), "delayed_state": ("W", "P"), "reverse_sps": ("W", "P")}


def rule_mask(variant, num_tokens, window, docs, omega=None):
  """The three rules of REFERENCES §1 applied to every (query, key) slot pair, literally:
  slots x1, ρ1, x2, ρ2, …; tok = slot // 2; 1. q >= k; 2. same document (a pair shares its
  document); 3. a persistent key is visible (within ω when the probe window is set), a
  temporary key iff tok(q) - tok(k) <= w. The key's kind decides, not the query's."""
  n = 2 * num_tokens
  out = np.zeros((n, n), bool)
  for q in range(n):
    for k in range(n):
      tq, tk = q // 2, k // 2
      if q < k or docs[tq] != docs[tk]:
        continue
      kind = TABLE[variant][k % 2]
      if kind == "W" and window is not None and tq - tk > window:
        continue
      if kind == "P" and omega is not None and tq - tk > omega:
        continue
      out[q, k] = True
  return out


DOCS = {"one": [1] * 9, "three": [1, 1, 1, 2, 2, 3, 3, 3, 3]}


@pytest.mark.parametrize("variant", ["sps", "delayed_state", "reverse_sps"])
@pytest.mark.parametrize("window", [0, 1, 3, 9, 20])
@pytest.mark.parametrize("docs", ["one", "three"])
@pytest.mark.parametrize("omega", [None, 2])
def test_slot_mask_is_the_rule(variant, window, docs, omega):
  got = sps.slot_mask(variant, 9, window, doc_ids=DOCS[docs] if docs != "one" else None, persistent_window=omega)
  assert got.shape == (18, 18) and got.dtype == bool
  np.testing.assert_array_equal(got, rule_mask(variant, 9, window, DOCS[docs], omega))


@pytest.mark.parametrize("docs", ["one", "three"])
@pytest.mark.parametrize("omega", [None, 0, 3])
def test_twox_memory_is_sps_with_window_at_least_T(docs, omega):
  got = sps.slot_mask("twox_memory", 9, None, doc_ids=DOCS[docs], persistent_window=omega)
  np.testing.assert_array_equal(got, rule_mask("twox_memory", 9, None, DOCS[docs], omega))
  np.testing.assert_array_equal(sps.slot_mask("twox_memory", 9, 9, doc_ids=DOCS[docs], persistent_window=omega), got)
  if omega is None:  # without the probe window, "every ρ persistent" and "w >= T" are the same mask
    for w in (9, 12):
      np.testing.assert_array_equal(sps.slot_mask("sps", 9, w, doc_ids=DOCS[docs]), got)
  with pytest.raises(ValueError, match="twox_memory"):
    sps.slot_mask("twox_memory", 9, 3)


def test_slot_mask_spot_checks_from_the_text():
  x, r = (lambda i: 2 * i), (lambda i: 2 * i + 1)  # slot index of x_i and ρ_i
  m = sps.slot_mask("sps", 8, 0)
  for i in range(8):  # w = 0: each ρ sees only itself among ρ keys, and every earlier x
    assert [k for k in range(1, 16, 2) if m[r(i), k]] == [r(i)]
    assert all(m[r(i), x(j)] for j in range(i + 1)) and not any(m[r(i), x(j)] for j in range(i + 1, 8))
  m = sps.slot_mask("sps", 8, 2)
  assert m[x(5), r(4)] and m[x(5), r(3)] and not m[x(5), r(2)]  # input queries see ρ keys within w
  assert not m[x(5), r(5)]  # causal over slots: ρ_5 comes after x_5
  assert m[r(5), r(3)] and not m[r(5), r(2)]
  d = sps.slot_mask("delayed_state", 8, 1)
  assert d[r(6), r(0)] and not d[r(6), x(4)] and d[r(6), x(5)]  # ρ persistent, x windowed
  two_docs = sps.slot_mask("sps", 8, 7, doc_ids=[1, 1, 1, 2, 2, 2, 2, 2])
  assert not two_docs[r(3), x(2)] and two_docs[r(3), x(3)] and two_docs[x(3), x(3)]
  with pytest.raises(ValueError, match="slot variant"):  # the standard variant is a family, not a slot layout
    sps.slot_mask("standard", 5, None)


def test_layouts_carry_the_same_metadata():
  for variant in sps.SLOT_VARIANTS:
    a, b = sps.slot_layout(variant, 6, "interleaved"), sps.slot_layout(variant, 6, "stream_major")
    order = np.argsort(b.pos)
    for field in ("pos", "tok", "kind"):
      np.testing.assert_array_equal(getattr(a, field), getattr(b, field)[order])
    np.testing.assert_array_equal(a.pos, np.arange(12))
    np.testing.assert_array_equal(b.pos[:6], np.arange(0, 12, 2))  # [x1..xT | ρ1..ρT]


# ----------------------------------------------------------------------------- the model


VOCAB = 264  # the 257 byte ids + the <predict> row 257 (the default tied ρ), padded to a multiple of 8
RHO = 257


def _config(variant, window=3, layout="stream_major", impl="xla", seq_len=16, **kw):
  c = tiny_config("/nonexistent", **{"family": "sps", "model.variant": variant, "model.window": window,
                                     "model.attention_impl": impl, "model.attention_chunk": 8,
                                     "data.seq_len": seq_len, "model.vocab_size": VOCAB, **kw})
  c.sps.layout = layout
  return c


def _batch(seq_len=16, rows=2, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, 257, size=(rows, seq_len + 1)).astype(np.int32)
  segment = np.ones_like(tokens)
  segment[:, 7:] = 2
  segment[-1, 11:] = 3
  segment[-1, 15:] = 0  # padding
  return {"tokens": jnp.asarray(tokens), "segment": jnp.asarray(segment)}


def _loss_and_grads(config, params, batch):
  family = registry.get_family(config)
  return jax.jit(jax.value_and_grad(lambda p: family.loss(p, batch, None, 0)[0]))(params)


def _init(config, **kw):
  return random_params(registry.get_family(config), **kw)


@pytest.mark.parametrize("variant,window,impl", [("sps", 3, "chunked"), ("delayed_state", 0, "xla"),
                                                 ("reverse_sps", 5, "xla")])
def test_layouts_give_the_same_loss_and_gradients(variant, window, impl):
  """Interleaved (dense reference) against stream-major (`impl`), one layer, two documents and
  padding. For sps stream-major runs the chunked path with tiles of 8 slots, which skips the
  tiles the rule leaves empty."""
  batch = _batch()
  cfg = lambda layout, impl: _config(variant, window, layout, impl, **{"model.n_layers": 1})
  params = _init(cfg("interleaved", "xla"))
  la, ga = _loss_and_grads(cfg("interleaved", "xla"), params, batch)
  lb, gb = _loss_and_grads(cfg("stream_major", impl), params, batch)
  assert np.isfinite(float(la)) and float(la) == pytest.approx(float(lb), rel=1e-6, abs=1e-6)
  for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-4)
  assert float(jnp.abs(ga["embed"]["embedding"][RHO]).sum()) > 0  # ρ (the tied row) is trained
  if impl == "chunked":
    from nsl.nn import masks
    lay = sps.slot_layout(variant, 16, "stream_major")
    assert (masks.block_map(sps.slot_rule(variant, window), lay, lay, 8, 8) == masks.EMPTY).sum() > 0


def test_rho_is_the_predict_row_of_the_tied_embedding():
  """The SPS authors' ρ (REFERENCES §1: "ρ id 50257", tied input embedding and head): by default ρ
  is the embedding row `predict_token_id` (the first id past the tokenizer's), so (1) the input
  at every ρ slot is that row, (2) the row is also an output class of the tied head and collects
  both gradients, (3) it is weight-decayed with the embedding matrix. `separate` is a d-vector
  that is none of these."""
  from nsl.train import state as state_lib

  tied_c = _config("sps", 3, "interleaved")
  sep_c = _config("sps", 3, "interleaved", **{"sps.predict_embedding": "separate"})
  nsl_config.validate(tied_c)
  nsl_config.validate(sep_c)
  tied, sep = registry.get_family(tied_c), registry.get_family(sep_c)
  assert tied.predict_token_id == RHO and sep.predict_token_id is None
  sep_params = _init(sep_c)
  assert "predict_embedding" in sep_params
  tied_params = {k: v for k, v in sep_params.items() if k != "predict_embedding"}
  assert jax.tree.structure(tied_params) == jax.tree.structure(nn.unbox(jax.eval_shape(tied.init, jax.random.PRNGKey(0))))
  # (1) the same forward as the separate model whose vector is that row
  rho = tied_params["embed"]["embedding"][RHO]
  sep_params = dict(sep_params, predict_embedding=rho)
  batch = _batch()
  lt, gt = _loss_and_grads(tied_c, tied_params, batch)
  ls, gs = _loss_and_grads(sep_c, sep_params, batch)
  assert float(lt) == pytest.approx(float(ls), rel=1e-6)
  np.testing.assert_allclose(sps.predict_vector(tied_params, RHO), rho)
  # (2) the row's gradient = the input path's (the separate vector's) + its output-class part
  out_class = gs["embed"]["embedding"][RHO]
  assert float(jnp.linalg.norm(out_class)) > 1e-3 * float(jnp.linalg.norm(gs["predict_embedding"]))
  np.testing.assert_allclose(gt["embed"]["embedding"][RHO], gs["predict_embedding"] + out_class, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(np.delete(gt["embed"]["embedding"], RHO, 0), np.delete(gs["embed"]["embedding"], RHO, 0),
                             rtol=1e-4, atol=1e-7)
  # (3) decayed with the matrix: two AdamW steps of zero gradient (warmup: lr 0, then the peak)
  for c, params, get in ((tied_c, tied_params, lambda p: p["embed"]["embedding"][RHO]),
                         (sep_c, sep_params, lambda p: p["predict_embedding"])):
    c.train.warmup_steps = 1
    opt = state_lib.make_optimizer(c)
    st, p = opt.init(params), params
    for _ in range(2):
      upd, st = opt.update(jax.tree.map(jnp.zeros_like, p), st, p)
      p = jax.tree.map(lambda a, b: a + b, p, upd)
    shrink = 1 - c.train.lr * c.train.weight_decay if c is tied_c else 1.0
    np.testing.assert_allclose(get(p), shrink * rho, rtol=1e-6)


def test_predict_token_id_defaults_past_the_tokenizer():
  assert sps.predict_token_id_of(_config("sps")) == 257  # byte ids 0..256
  c = _config("sps", **{"data.tokenizer": "bpe", "data.tokenizer_vocab": 4096, "model.vocab_size": 4160})
  assert sps.predict_token_id_of(c) == 4096
  c.sps.predict_token_id = 4159
  assert sps.predict_token_id_of(c) == 4159
  nsl_config.validate(c)
  c = nsl_config.load_config(os.path.join(ROOT, "configs/sps.py:sps_xs"))  # GPT-2: the authors' id
  assert sps.predict_token_id_of(c) == 50257 and registry.get_family(c).predict_token_id == 50257
  std = registry.get_family(_config("standard", None, **{"model.vocab_size": 257}))
  assert type(std) is StandardFamily  # the standard variant is the standard family: no ρ, no free row
  nsl_config.validate(_config("standard", None, **{"model.vocab_size": 257}))


@pytest.mark.parametrize("variant", sps.SLOT_VARIANTS)
def test_read_out_is_causal_and_stays_in_its_document(variant):
  config = _config(variant, 2)
  family = registry.get_family(config)
  params = _init(config, std=0.08)  # sharper than at initialisation
  logits_fn = jax.jit(lambda b: family.token_logits(params, b))
  batch = _batch(16, rows=1)
  segment = np.ones((1, 17), np.int32)
  segment[:, 10:] = 2
  batch["segment"] = jnp.asarray(segment)
  base = np.asarray(logits_fn(batch))
  changed = dict(batch, tokens=batch["tokens"].at[0, 6].set((batch["tokens"][0, 6] + 1) % 257))
  after = np.asarray(logits_fn(changed))
  np.testing.assert_allclose(after[0, :6], base[0, :6], atol=1e-6)  # earlier tokens' predictions
  np.testing.assert_allclose(after[0, 10:], base[0, 10:], atol=1e-6)  # the next document
  assert np.abs(after[0, 6] - base[0, 6]).max() > 1e-4  # the read-out of pair 6 sees x_6
  assert np.abs(after[0, 7:10] - base[0, 7:10]).max() > 1e-4


def test_standard_variant_is_the_plain_trunk():
  std = StandardFamily(_config("standard", None, **{"family": "standard"}))
  fam = registry.get_family(_config("standard", 64))  # the window does not apply: no temporary keys
  assert type(fam) is StandardFamily and fam.rule == std.rule  # an alias of the family, not a window
  params = _init(_config("standard", None, **{"family": "standard"}))
  batch = _batch()
  assert jax.tree.structure(params) == jax.tree.structure(nn.unbox(jax.eval_shape(fam.init, jax.random.PRNGKey(0))))
  loss = lambda f: float(jax.jit(lambda p: f.loss(p, batch, None, 0)[0])(params))
  assert loss(fam) == pytest.approx(loss(std), rel=1e-6)
  assert fam.flops_per_token() == pytest.approx(std.flops_per_token(), rel=1e-12)


@pytest.mark.parametrize("variant,window,rho", [("sps", 0, "tied"), ("sps", 5, "separate"), ("twox_memory", None, "tied"),
                                                ("delayed_state", 3, "tied"), ("reverse_sps", 7, "tied")])
def test_flops_count_two_slots_one_head_and_visible_pairs(variant, window, rho):
  fam = registry.get_family(_config(variant, window, seq_len=24, **{"sps.predict_embedding": rho}))
  counts = fam.param_counts()  # family only: nothing compiled
  d, v, layers = 32, VOCAB, 2
  # token embedding (ρ is one of its rows when tied), + the separate <predict> vector otherwise
  assert counts["params_embedding"] == v * d + (d if rho == "separate" else 0)
  body = counts["params_non_embedding"]
  pairs = rule_mask(variant, 24, window, [1] * 24).sum()
  want = 6 * (2 * body + v * d) + 12 * layers * d * pairs / 24
  assert fam.flops_per_token() == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("overrides,match", [
    ({"model.variant": "sps", "model.window": None}, "model.window is None"),
    ({"model.variant": "reverse_sps", "model.window": None}, "model.window is None"),
    ({"model.variant": "twox_memory", "model.window": 8}, "twox_memory"),
    ({"model.variant": "bogus"}, "variant"),
    ({"sps.predict_embedding": "shared"}, "sps.predict_embedding"),
    ({"model.vocab_size": 257}, "predict_token_id=257"),  # no free row for ρ above the byte ids
    ({"sps.predict_token_id": 100}, "predict_token_id=100"),  # a real token's row
    ({"sps.predict_token_id": VOCAB}, "predict_token_id=264"),  # outside the embedding
    ({"sps.predict_embedding": "separate", "sps.predict_token_id": 260}, "no effect"),
])
def test_validate_names_the_field(overrides, match):
  c = _config("sps", **overrides)
  with pytest.raises(ConfigError, match=match):
    nsl_config.validate(c)


def test_bad_layout_and_default_layout():
  c = _config("sps", layout="diagonal")
  with pytest.raises(ConfigError, match="sps.layout"):
    nsl_config.validate(c)
  c = tiny_config("/nonexistent", **{"family": "sps", "model.variant": "sps", "model.window": 4, "model.vocab_size": VOCAB})
  assert "layout" not in c.model
  nsl_config.validate(c)
  assert registry.get_family(c).layout_name == sps.DEFAULT_LAYOUT == "stream_major"
  c.sps.layout = "interleaved"
  assert registry.get_family(c).layout_name == "interleaved"


# ----------------------------------------------------------------------------- configs


SPS_CONFIGS = [f"configs/sps.py:{name}" for name in nsl_config.folded()["sps"] if not name.startswith("standard_")]


@pytest.mark.parametrize("path", SPS_CONFIGS + ["configs/sps.py:standard_tiny"])
def test_describe_every_config(path):
  config = nsl_config.load_config(os.path.join(ROOT, path))
  nsl_config.validate(config)
  d = loop.describe(config)
  assert d["params_total"] == d["params_embedding"] + d["params_non_embedding"] > 0
  size = path.rsplit("_", 1)[1]
  if size in nsl_config.LADDER_PARAMS:
    want = nsl_config.LADDER_PARAMS[size]
    assert abs(d["params_total"] - want) / want < 0.01
    assert d["tokens_per_step"] == 4096 * 96 and config.model.vocab_size == 50304
    assert config.model.window == (None if config.model.variant == "twox_memory" else 64)
  if config.family == "sps":  # 2T slots: at least twice the body FLOPs of the standard model
    assert d["flops_per_token"] > 6 * (2 * d["params_non_embedding"] + d["params_embedding"] - config.model.d_model)


def test_window_grid_covers_the_ablation():
  import importlib.util
  spec = importlib.util.spec_from_file_location("sps_window", os.path.join(ROOT, "configs/grids/sps_window.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  windowed, standard = mod.get_grid()
  assert windowed["axes"]["model.window"] == [0, 16, 64, 256]
  assert windowed["axes"]["model.variant"] == ["sps", "delayed_state", "reverse_sps"]
  assert standard["axes"] == {"config": ["configs/sps.py:standard_s"]}
  base = nsl_config.load_config(os.path.join(ROOT, windowed["base"]))
  assert base.family == "sps" and base.model.n_layers == 12
  for variant in windowed["axes"]["model.variant"]:
    for w in windowed["axes"]["model.window"]:
      base.model.variant, base.model.window = variant, w
      nsl_config.validate(base)
