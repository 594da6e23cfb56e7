"""SED baseline: span corruption (counts, reconstruction, static shapes, documents), the
encoder-decoder's attention rules, the loss, and a tiny Trainer run."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.data import span_corruption as sc
from nsl.models import registry
from tests.helpers import short_run, tiny_config

V = 400  # byte ids < 257, sentinels 399..300, decoder start 299


def _sed_config(data_dir="/nonexistent", **kw):
  c = tiny_config(data_dir, **{"family": "sed", "model.variant": "sed", "model.vocab_size": V,
                               "model.n_layers": 3, **kw})
  c.sed.gen_layers = 1
  c.sed.noise_density, c.sed.mean_span, c.sed.sentinels = 0.15, 4.0, 100
  return c


def _reconstruct(enc, targets):
  """Undo the corruption from the definition: each sentinel in the inputs stands for the target
  tokens after the same sentinel in the targets."""
  spans, cur = {}, None
  for t in targets:
    if t >= V - 100:
      cur = int(t)
      spans[cur] = []
    else:
      spans[cur].append(int(t))
  out = []
  for t in enc:
    out.extend(spans[int(t)] if t >= V - 100 else [int(t)])
  return out


@pytest.mark.parametrize("length", [64, 128, 2048])
def test_span_corruption_is_static_and_invertible(length):
  n, s = sc.counts(length)
  assert n == round(0.15 * length) and s == round(n / 4)
  rng = np.random.default_rng(length)
  tokens = jnp.asarray(rng.integers(1, 257, length), jnp.int32)
  segment = jnp.ones((length,), jnp.int32)
  fn = jax.jit(lambda k: sc.corrupt(k, tokens, segment, V))
  seen = set()
  for seed in range(3):
    out = jax.tree.map(np.asarray, fn(jax.random.PRNGKey(seed)))
    assert out["enc_tokens"].shape == (length - n + s,) and out["targets"].shape == (n + s,)
    assert _reconstruct(out["enc_tokens"], out["targets"]) == list(np.asarray(tokens))
    sentinels = out["targets"][out["targets"] >= V - 100]
    np.testing.assert_array_equal(sentinels, V - 1 - np.arange(s))  # in order, one per span
    assert (out["dec_inputs"][1:] == out["targets"][:-1]).all() and out["dec_inputs"][0] == V - 101
    seen.add(out["enc_tokens"].tobytes())
  assert len(seen) == 3  # the spans move with the key; the shapes do not


def test_mean_span_and_density_over_many_rows():
  keys = jax.random.split(jax.random.PRNGKey(0), 8)
  noise = np.asarray(jax.jit(jax.vmap(lambda k: sc.noise_mask(k, 512)[0]))(keys))
  assert noise.mean() == pytest.approx(0.15, abs=0.002)
  starts = (noise[:, 1:] & ~noise[:, :-1]).sum()
  assert noise.sum() / starts == pytest.approx(4.0, rel=0.05)


def test_documents_stay_apart():
  tokens = jnp.arange(1, 65, dtype=jnp.int32)
  segment = jnp.asarray([1] * 30 + [2] * 30 + [0] * 4, jnp.int32)
  out = jax.tree.map(np.asarray, sc.corrupt(jax.random.PRNGKey(3), tokens, segment, V))
  # Every non-sentinel token keeps its document; a target sentinel takes the next token's.
  for toks, seg in ((out["enc_tokens"], out["enc_segment"]), (out["targets"], out["dec_segment"])):
    plain = toks < V - 100
    np.testing.assert_array_equal(seg[plain], np.asarray(segment)[toks[plain] - 1])
  sent = np.nonzero(out["targets"] >= V - 100)[0]
  np.testing.assert_array_equal(out["dec_segment"][sent], out["dec_segment"][sent + 1])
  # The decoder restarts at each document.
  first = np.nonzero(np.diff(out["dec_segment"]))[0] + 1
  assert (out["dec_inputs"][first] == V - 101).all()


@pytest.fixture(scope="module")
def family_params():
  family = registry.get_family(_sed_config(**{"data.seq_len": 64}))
  params = jax.jit(lambda r: nn.unbox(family.init(r)))(jax.random.PRNGKey(0))
  return family, params


def test_parameters_from_the_short_init_row_are_the_full_rows(family_params):
  family, params = family_params  # initialised on SEDFamily.init_len = 32 tokens, the row is 64
  full = registry.get_family(_sed_config(**{"data.seq_len": 64}))
  full.init_len = None
  want = jax.jit(lambda r: nn.unbox(full.init(r)))(jax.random.PRNGKey(0))
  jax.tree.map(np.testing.assert_array_equal, params, want)


def test_encoder_is_bidirectional_and_decoder_causal(family_params):
  family, params = family_params
  rng = np.random.default_rng(0)
  c = family.corrupt({"tokens": jnp.asarray(rng.integers(1, 257, (1, 65)), jnp.int32),
                      "segment": jnp.ones((1, 65), jnp.int32)}, jax.random.PRNGKey(0))
  apply = jax.jit(lambda e, d: family.model.apply({"params": params}, e, c["enc_segment"], d, c["dec_segment"]))
  base = np.asarray(apply(c["enc_tokens"], c["dec_inputs"]))
  # Changing the last encoder token changes the first decoder position (bidirectional encoder).
  enc2 = c["enc_tokens"].at[0, -1].set(7)
  assert np.abs(np.asarray(apply(enc2, c["dec_inputs"]))[0, 0] - base[0, 0]).max() > 1e-6
  # Changing decoder input j changes only positions >= j (causal decoder).
  j = 10
  dec2 = c["dec_inputs"].at[0, j].set(7)
  out = np.asarray(apply(c["enc_tokens"], dec2))
  np.testing.assert_allclose(out[0, :j], base[0, :j], atol=1e-5)
  assert np.abs(out[0, j] - base[0, j]).max() > 1e-6


def test_loss_counts_targets_and_flops_below_6n(family_params):
  family, params = family_params
  tokens = jnp.asarray(np.random.default_rng(1).integers(1, 257, (2, 65)), jnp.int32)
  segment = jnp.ones_like(tokens).at[1, 40:].set(0)  # padding: no loss there
  loss, m = jax.jit(family.loss)(params, {"tokens": tokens, "segment": segment}, jax.random.PRNGKey(2), 0)
  _, lt = sc.lengths(64)
  assert np.isfinite(float(loss)) and 0 < float(m["weight"]) < 2 * lt
  assert abs(float(loss) - np.log(V)) < 1.0
  assert family.flops_per_token() < 6 * family.param_counts()["params_total"]


@pytest.mark.slow
def test_trainer_runs_sed(tmp_path):
  result = short_run(tmp_path, _sed_config)
  assert result["flops_per_token"] < 6 * result["params_total"]


def test_eval_nll_scores_original_tokens_only(family_params):
  """SED's evaluation NLL is per original token: the targets that are corrupted text, without the
  sentinel targets, under the fixed evaluation corruption (exactly n noise tokens per full row)."""
  family, params = family_params
  tokens = jnp.asarray(np.random.default_rng(3).integers(1, 257, (2, 65)), jnp.int32)
  batch = {"tokens": tokens, "segment": jnp.ones_like(tokens)}
  total, count = jax.jit(family.eval_nll)(params, batch)
  n, s = sc.counts(64)
  assert float(count) == 2 * n
  c = family.corrupt(batch, jax.random.fold_in(jax.random.PRNGKey(0), 0x5ED))
  logits = family.model.apply({"params": params}, c["enc_tokens"], c["enc_segment"], c["dec_inputs"],
                              c["dec_segment"])
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  t = np.asarray(c["targets"])
  text = t < V - 100
  want = -np.take_along_axis(logp, t[..., None], axis=-1)[..., 0][text].sum()
  np.testing.assert_allclose(float(total), want, rtol=1e-5)
