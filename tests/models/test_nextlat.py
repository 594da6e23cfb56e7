"""NextLat and MTP losses from their definitions (REFERENCES §4) as the authors' code computes
them (docs/xcheck/nextlat.md): the d-step rollout, the stop-gradients (targets, teacher logits and
the head's weights in L_KL only), prompt and document-boundary masks."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import nextlat as nextlat_configs
from nsl.models import nextlat, registry
from tests.helpers import nextlat_rollout_losses

V, T, D, HORIZON, ANS = 32, 10, 16, 3, 7


def _config(family="nextlat"):
  c = nextlat_configs.get_config(f"{family}_tiny")
  c.model.vocab_size, c.model.d_model, c.model.n_layers, c.model.n_heads, c.model.d_ff = V, D, 1, 2, 32
  c.data.seq_len = T
  c.data.answer_token = ANS
  if family == "nextlat":
    c.nextlat.horizon, c.nextlat.hidden = HORIZON, 24
  else:
    c.mtp.horizon = HORIZON
  return c


def _batch():
  # row 0: one document with a prompt ending in ANS at input position 3; row 1: two documents
  # (EOS = 256 is not in this vocab, so segments are given explicitly).
  tokens = np.array([[1, 2, 3, ANS, 4, 5, 6, 8, 9, 10, 11],
                     [12, ANS, 13, 14, 15, 16, 17, ANS, 18, 19, 20]], np.int32)
  segment = np.array([[1] * 11, [1] * 5 + [2] * 6], np.int32)
  return {"tokens": jnp.asarray(tokens), "segment": jnp.asarray(segment)}


@pytest.fixture(scope="module")
def setup():
  fam = registry.get_family(_config())
  params = nn.unbox(fam.init(jax.random.PRNGKey(0)))
  return fam, params


def test_answer_weights_and_rollout_mask():
  b = _batch()
  inputs, seg = b["tokens"][:, :-1], b["segment"][:, :-1]
  w = np.asarray(nextlat.answer_weights(inputs, seg, ANS))
  np.testing.assert_array_equal(w[0], [0, 0, 0, 1, 1, 1, 1, 1, 1, 1])
  np.testing.assert_array_equal(w[1], [0, 1, 1, 1, 1, 0, 0, 1, 1, 1])  # doc 2 restarts masked
  v = np.asarray(nextlat.rollout_valid(seg, 2))
  np.testing.assert_array_equal(v[0], [1] * 8 + [0, 0])
  np.testing.assert_array_equal(v[1], [1, 1, 1, 0, 0, 1, 1, 1, 0, 0])  # never across the boundary


def _reference(fam, params, batch):
  """L_next-h and L_KL by explicit per-(row, t, i) rollouts of the dynamics model."""
  inputs, targets, seg, weights = nextlat.task_targets(batch, ANS)
  h = fam.model.apply({"params": params}, inputs, seg, method="hidden")
  lh, kl = nextlat_rollout_losses(fam, params, inputs, seg, weights, h, HORIZON)
  return np.mean(lh), np.mean(kl), lh[-1]


def test_losses_match_definition(setup):
  fam, params = setup
  batch = _batch()
  loss, m = fam.loss(params, batch, None, 0)
  ref_h, ref_kl, ref_last = _reference(fam, params, batch)
  np.testing.assert_allclose(m["next_h"], ref_h, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(m["next_h_last"], ref_last, rtol=1e-4, atol=1e-6)  # the d-th step
  np.testing.assert_allclose(m["kl"], ref_kl, rtol=1e-3, atol=1e-6)
  np.testing.assert_allclose(loss, m["ce"] + m["next_h"] + m["kl"], rtol=1e-5)  # λ_h = λ_KL = 1
  assert m["weight"] == 13  # answer targets only: 7 in row 0; 3 + 3 in row 1 (not across EOS)


def _norm(tree):
  return float(optax.global_norm(tree))


def _grads(fam, params, name, batch=None):
  inputs, targets, seg, weights = nextlat.task_targets(batch or _batch(), ANS)
  f = lambda p: fam.model.apply({"params": p}, inputs, targets, seg, weights, 1.0, 1.0, method="losses")[1][name]
  return jax.jit(jax.grad(f))(params)


def test_kl_gradient_reaches_trunk_and_embedding_not_head(setup):
  """The authors' L_KL: student logits F.linear(ĥ, W_head.detach()) from the one rollout, so its
  gradient reaches p_ψ, the trunk through h_t and the input embedding fed to p_ψ; the head's
  weights (untied here, `embed/head`) and the teacher side get none."""
  fam, params = setup
  assert "head" in params["embed"]  # the NextLat configs untie the head (model.tie_embeddings=False)
  g = _grads(fam, params, "kl")
  assert _norm(g["dynamics"]) > 0.0 and _norm(g["trunk"]) > 0.0 and _norm(g["embed"]["embedding"]) > 0.0
  assert _norm(g["embed"]["head"]) == 0.0
  g = _grads(fam, params, "next_h")
  assert _norm(g["dynamics"]) > 0.0 and _norm(g["trunk"]) > 0.0 and _norm(g["embed"]["embedding"]) > 0.0
  assert _norm(g["embed"]["head"]) == 0.0
  g = _grads(fam, params, "ce")
  assert _norm(g["dynamics"]) == 0.0 and _norm(g["embed"]["head"]) > 0.0


def test_emb_grad_off_cuts_only_the_path_through_p_psi(setup):
  """`emb_grad=False` stops the embedding fed to p_ψ: the embedding still learns through the
  trunk (it is the trunk's input), so its gradient changes while the trunk's stays the same."""
  fam, params = setup
  params = {**params, "dynamics": jax.tree.map(lambda w: 30.0 * w, params["dynamics"])}  # a visible path
  c = _config()
  c.nextlat.emb_grad = False
  off = registry.get_family(c)
  for name in ("kl", "next_h"):
    g_on, g_off = _grads(fam, params, name), _grads(off, params, name)
    np.testing.assert_allclose(_norm(jax.tree.map(jnp.subtract, g_on["trunk"], g_off["trunk"])), 0.0, atol=1e-7)
    assert _norm(g_on["embed"]["embedding"] - g_off["embed"]["embedding"]) > 1e-2 * _norm(g_on["embed"]["embedding"])


def test_dynamics_is_the_authors_module(setup):
  """p_ψ = h + W2 GELU_erf(W1 GELU_erf(W0 RMSNorm(concat[e, h]))), bias-free, recomputed by hand."""
  fam, params = setup
  # Weights large enough that the GELU's inputs are O(1), where erf and tanh GELU differ by ~1e-3.
  params = {**params, "dynamics": jax.tree.map(lambda w: 30.0 * w, params["dynamics"])}
  p = params["dynamics"]
  assert sorted(p) == ["norm", "w0", "w1", "w2"]
  rng = np.random.default_rng(0)
  h, e = rng.normal(size=(2, 3, D)).astype(np.float32), rng.normal(size=(2, 3, D)).astype(np.float32)
  x = np.concatenate([e, h], -1)
  x = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5) * np.asarray(p["norm"]["scale"])
  from scipy.special import erf
  gelu = lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2)))
  want = h + gelu(gelu(x @ np.asarray(p["w0"])) @ np.asarray(p["w1"])) @ np.asarray(p["w2"])
  got = fam.model.apply({"params": params}, jnp.asarray(h), jnp.asarray(e), method=lambda m, a, b: m.dynamics(a, b))
  # float32 sums of terms up to ~1e3 carry ~1e-4 of rounding whatever their result; tanh's GELU
  # would be off by ~1 here, so a bound relative to the output's scale still tells them apart
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
  tanh_gelu = lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
  other = h + tanh_gelu(tanh_gelu(x @ np.asarray(p["w0"])) @ np.asarray(p["w1"])) @ np.asarray(p["w2"])
  assert np.max(np.abs(other - want)) > 1e-4  # the check tells the two GELUs apart


def test_next_h_targets_are_stop_gradient(setup):
  """Perturbing the trunk only through the target side changes nothing in the gradient: the
  derivative of L_next-h w.r.t. h equals the one with the rollout input alone differentiable."""
  fam, params = setup
  batch = _batch()
  inputs, targets, seg, weights = nextlat.task_targets(batch, ANS)
  h = fam.model.apply({"params": params}, inputs, seg, method="hidden")
  emb = fam.model.apply({"params": params}, inputs, method=lambda m, x: m.embedder.encode(x))

  def lh_of(h_in, h_tgt):
    r, out = h_in, []
    for i in range(1, HORIZON + 1):
      r = fam.model.apply({"params": params}, r, nextlat.shift_left(emb, i), method=lambda m, a, e: m.dynamics(a, e))
      valid = nextlat.rollout_valid(seg, i).astype(jnp.float32)
      out.append(nextlat._masked_mean(nextlat.smooth_l1(r, jax.lax.stop_gradient(nextlat.shift_left(h_tgt, i))), valid))
    return sum(out) / HORIZON

  g_target_side = jax.grad(lambda x: lh_of(h, x))(h)
  assert float(jnp.abs(g_target_side).max()) == 0.0


def test_gpt_variant_and_mtp():
  c = _config()
  c.model.variant = "gpt"
  fam = registry.get_family(c)
  params = nn.unbox(fam.init(jax.random.PRNGKey(0)))
  assert "dynamics" not in params
  loss, m = fam.loss(params, _batch(), None, 0)
  assert set(m) == {"weight", "ce"} and m["weight"] == 13
  fam = registry.get_family(_config("mtp"))
  params = nn.unbox(fam.init(jax.random.PRNGKey(0)))
  assert sorted(k for k in params if k.startswith("mtp_head")) == ["mtp_head_2", "mtp_head_3"]
  loss, m = fam.loss(params, _batch(), None, 0)
  np.testing.assert_allclose(loss, (m["ce"] + m["ce_head_2"] + m["ce_head_3"]) / 3, rtol=1e-6)
  assert np.isfinite(fam.flops_per_token())


def test_eval_nll_is_the_next_token_ce_not_the_total_loss(setup):
  from nsl.train import step as step_lib

  fam, params = setup
  loss, metrics = fam.loss(params, _batch(), jax.random.PRNGKey(0), jnp.zeros((), jnp.int32))
  total_nll, weight = step_lib.make_eval_step(fam)(params, _batch())
  np.testing.assert_allclose(total_nll / weight, metrics["ce"], rtol=1e-6)
  assert float(loss) > float(metrics["ce"]) + 1e-3  # the latent terms are in the training loss only
