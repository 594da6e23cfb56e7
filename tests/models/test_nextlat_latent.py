"""NextLat's two readings of "the final-layer hidden state" h (`config.nextlat.latent`,
REFERENCES §4): `final_norm` (after the trunk's final RMSNorm, what the tied head reads) and
`residual` (the final residual stream before that norm; the head then reads RMSNorm(ĥ)). Both
are checked against an independent computation: the residual latent from the trunk's blocks
applied one by one without the final norm, and L_next-h / L_KL from explicit rollouts."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import nextlat as nextlat_configs
from nsl.errors import ConfigError
from nsl.models import nextlat, registry
from nsl.nn import layers, masks
from tests.helpers import nextlat_rollout_losses

V, T, D, HORIZON, ANS = 32, 10, 16, 2, 7


def _family(latent: str, n_layers: int = 2):
  c = nextlat_configs.get_config("nextlat_tiny")
  c.model.vocab_size, c.model.d_model, c.model.n_layers, c.model.n_heads, c.model.d_ff = V, D, n_layers, 2, 32
  c.data.seq_len, c.data.answer_token = T, ANS
  c.nextlat.horizon, c.nextlat.hidden, c.nextlat.latent = HORIZON, 24, latent
  fam = registry.get_family(c)
  return fam, nn.unbox(fam.init(jax.random.PRNGKey(1)))


def _batch():
  tokens = np.array([[1, 2, 3, ANS, 4, 5, 6, 8, 9, 10, 11],
                     [12, ANS, 13, 14, 15, 16, 17, ANS, 18, 19, 20]], np.int32)
  segment = np.array([[1] * 11, [1] * 5 + [2] * 6], np.int32)
  return {"tokens": jnp.asarray(tokens), "segment": jnp.asarray(segment)}


def _residual_by_blocks(fam, params, inputs, seg):
  """The final residual stream, block by block (no final norm), independent of `latents`."""
  x = params["embed"]["embedding"][inputs]  # the input embedding (the head is `embed/head` here)
  layout = masks.Layout.causal(inputs.shape[1])
  for i in range(fam.dims.n_layers):
    blk = layers.Block(fam.dims, fam.rule, layout)
    x = blk.apply({"params": layers.layer_params(params["trunk"], i)}, x, seg)
  return np.asarray(x)


def _rms(x, scale, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


@pytest.mark.parametrize("latent", ["final_norm", "residual"])
def test_latent_is_the_chosen_hidden_state(latent):
  fam, params = _family(latent)
  inputs, seg = _batch()["tokens"][:, :-1], _batch()["segment"][:, :-1]
  z, h = fam.model.apply({"params": params}, inputs, seg, method="latents")
  h_ref = fam.model.apply({"params": params}, inputs, seg, method="hidden")  # what the head reads
  np.testing.assert_allclose(h, h_ref, rtol=1e-5, atol=1e-6)
  res = _residual_by_blocks(fam, params, inputs, seg)
  scale, eps = np.asarray(params["trunk"]["final_norm"]["scale"]), fam.dims.norm_eps
  np.testing.assert_allclose(_rms(res, scale, eps), h, rtol=1e-4, atol=1e-5)  # h = RMSNorm(residual)
  np.testing.assert_allclose(z, res if latent == "residual" else h, rtol=1e-4, atol=1e-5)
  # The head reads RMSNorm(z) for residual latents, z itself for final-normed ones.
  read = fam.model.apply({"params": params}, jnp.asarray(z), method="read")
  np.testing.assert_allclose(read, h, rtol=1e-4, atol=1e-5)


def _reference(fam, params, batch, latent):
  """(L_next-h, L_KL) by explicit per-(row, t, i) rollouts from the residual or normed latent."""
  inputs, targets, seg, weights = nextlat.task_targets(batch, ANS)
  res = _residual_by_blocks(fam, params, inputs, seg)
  scale, eps = np.asarray(params["trunk"]["final_norm"]["scale"]), fam.dims.norm_eps
  z = res if latent == "residual" else _rms(res, scale, eps)
  head_in = (lambda v: _rms(v, scale, eps)) if latent == "residual" else (lambda v: v)
  lh, kl = nextlat_rollout_losses(fam, params, inputs, seg, weights, z, HORIZON, head_in)
  return np.mean(lh), np.mean(kl)


@pytest.mark.parametrize("latent", ["final_norm", "residual"])
def test_losses_use_the_chosen_latent(latent):
  fam, params = _family(latent)
  batch = _batch()
  loss, m = fam.loss(params, batch, None, 0)
  ref_h, ref_kl = _reference(fam, params, batch, latent)
  np.testing.assert_allclose(m["next_h"], ref_h, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(m["kl"], ref_kl, rtol=1e-3, atol=1e-6)
  np.testing.assert_allclose(loss, m["ce"] + m["next_h"] + m["kl"], rtol=1e-5)
  other = _reference(fam, params, batch, "final_norm" if latent == "residual" else "residual")[0]
  assert abs(other - ref_h) > 1e-3 * ref_h  # the two readings are different losses here


def test_residual_kl_gradient_skips_the_frozen_head_and_norm():
  """With `residual`, L_KL's logits are the head on RMSNorm(ĥ) with the head's weights and the
  norm's scale frozen: the gradient reaches the trunk's blocks and the embedding fed to p_ψ
  (the authors' stop-gradients), never the head or the final norm's scale."""
  fam, params = _family("residual")
  inputs, targets, seg, weights = nextlat.task_targets(_batch(), ANS)
  metric = lambda name: lambda p: fam.model.apply({"params": p}, inputs, targets, seg, weights, 1.0, 1.0,
                                                  method="losses")[1][name]
  norm = lambda t: float(optax.global_norm(t))
  g = jax.jit(jax.grad(metric("kl")))(params)
  assert norm(g["trunk"]["final_norm"]) == 0.0 and norm(g["embed"]["head"]) == 0.0
  assert norm(g["trunk"]["block_1"]) > 0.0 and norm(g["embed"]["embedding"]) > 0.0 and norm(g["dynamics"]) > 0.0
  g = jax.jit(jax.grad(metric("next_h")))(params)
  assert norm(g["trunk"]["block_1"]) > 0.0  # the trunk is shaped via h_t
  # L_next-h compares residual vectors: the final norm is not on its path.
  assert norm(g["trunk"]["final_norm"]) == 0.0


def test_latent_option_is_checked():
  with pytest.raises(ConfigError, match="latent"):
    _family("pre_norm")


def test_cached_trunk_returns_the_residual_latent():
  """Self-speculative drafting starts from the latent: the shared cached trunk (nsl.decode) gives
  the same (residual, final-normed) pair as the training path, at prefill and when extending."""
  from nsl import decode

  fam, params = _family("residual")
  tokens = jnp.asarray(_batch()["tokens"][:1, :8])
  z, h = fam.model.apply({"params": params}, tokens, jnp.ones_like(tokens), method="latents")
  plan = fam.slot_plan()
  (r5, h5), cache = decode.prefill_hidden(fam.dims, plan, params, tokens[:, :5], 10, with_residual=True)
  np.testing.assert_allclose(r5, z[:, 4], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(h5, h[:, 4], rtol=1e-4, atol=1e-5)
  (r, hh), _ = decode.extend(fam.dims, plan, params, cache, tokens[:, 5:8], 5, with_residual=True)
  np.testing.assert_allclose(r, z[:, 5:8], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(hh, h[:, 5:8], rtol=1e-4, atol=1e-5)
  plain, _ = decode.extend(fam.dims, plan, params, cache, tokens[:, 5:8], 5)
  np.testing.assert_allclose(plain, h[:, 5:8], rtol=1e-4, atol=1e-5)  # the default: h alone


def test_residual_latent_speculative_greedy_equals_plain():
  from nsl import speculative

  fam, params = _family("residual")
  params["embed"]["embedding"] = params["embed"]["embedding"] * 40.0  # sharp: no near-ties
  dec = speculative.Decoder(fam, params, draft_len=3)
  prompt = np.array([1, 2, 3, ANS], np.int32)
  plain = dec.generate(prompt, 6)
  spec, stats = dec.generate_speculative(prompt, 6)
  np.testing.assert_array_equal(spec, plain)
  assert stats["rounds"] >= 1 and all(0 <= a <= 3 for a in stats["accepted"])
