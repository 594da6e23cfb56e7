"""LIFT from its definitions (nsl/models/lift.py docstring): states, fusion, loss, dropout,
self-state adaptation, cached own-state feedback, and teachers (on the fly and precomputed)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.models import lift
from nsl.nn import cross_entropy, layers
from tests.helpers import fake_run

V, D = 16, 16


def tiny_config(variant="lift", **lift_overrides):
  from configs import base

  c = base.get_config()
  c.family = "lift"
  c.model.variant = variant
  c.model.vocab_size = V
  c.model.d_model = D
  c.model.n_layers = 2
  c.model.n_heads = 2
  c.model.d_ff = 32
  c.model.attention_impl = "xla"
  c.data.seq_len = 8
  c.train.steps = 100
  c.lift = lift.default_lift_config()
  c.lift.top_k = 4
  c.lift.adapt_fraction = 0.0  # only the adaptation test turns it on (cheaper: no lax.cond)
  for k, v in lift_overrides.items():
    c.lift[k] = v
  return c


def params_of(config, seed=0):
  return nn.unbox(jax.jit(lift.LiftFamily(config).init)(jax.random.PRNGKey(seed)))


def family_and_params(variant="lift", seed=0, **kw):
  """(family, params), shared by every test asking for the same variant, seed and fields: this
  file's time is its compiles (jax arrays are immutable and no test changes a family's state)."""
  return _family_and_params(variant, seed, tuple(sorted(kw.items())))


@functools.cache
def _family_and_params(variant, seed, kw):
  fam = lift.LiftFamily(tiny_config(variant, **dict(kw)))
  return fam, nn.unbox(jax.jit(fam.init)(jax.random.PRNGKey(seed)))  # jitted: eager init compiles op by op


def jit_loss(variant="lift", **kw):
  """`jax.jit(fam.loss)` of `family_and_params(variant, **kw)`'s family, one wrapper per family, so
  the tests calling it on batches of one shape share its compile."""
  return _jit_loss(variant, tuple(sorted(kw.items())))


@functools.cache
def _jit_loss(variant, kw):
  return jax.jit(family_and_params(variant, **dict(kw))[0].loss)


def batch(seed=0, b=2, t=9):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, V - 1, (b, t)).astype(np.int32)
  return {"tokens": jnp.asarray(tokens), "segment": jnp.ones((b, t), jnp.int32)}


def test_state_of_known_logits_is_topk_temperature_softmax():
  logits = jnp.array([2.0, 1.0, 0.5, -1.0, 3.0, 0.0])
  got = np.asarray(lift.state_from_logits(logits, top_k=3, temperature=1.5))
  e = np.exp(np.array([3.0, 2.0, 1.0]) / 1.5)
  want = np.zeros(6)
  want[[4, 0, 1]] = e / e.sum()
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  assert np.count_nonzero(got) == 3 and abs(got.sum() - 1) < 1e-6
  full = np.asarray(lift.state_from_logits(logits, top_k=99, temperature=1.5))  # k >= V: every logit
  np.testing.assert_allclose(full, np.exp(logits / 1.5) / np.exp(logits / 1.5).sum(), rtol=1e-6)
  # k >= V is a plain temperature softmax; batched shapes are kept.
  full = lift.state_from_logits(jnp.stack([logits, -logits]), top_k=100, temperature=2.0)
  np.testing.assert_allclose(full, jax.nn.softmax(jnp.stack([logits, -logits]) / 2.0), rtol=1e-6)


@pytest.mark.parametrize("top_k", [3, 40])
def test_state_embedding_is_the_state_times_the_embedding(top_k):
  """Decode's s·E gathers the k kept rows of E; it equals the dense state times E."""
  rng = np.random.default_rng(0)
  logits, emb = jnp.asarray(rng.normal(size=(2, 40)), jnp.float32), jnp.asarray(rng.normal(size=(40, 8)), jnp.float32)
  want = lift.state_from_logits(logits, top_k, 1.5) @ emb
  np.testing.assert_allclose(lift.state_embedding(logits, top_k, 1.5, emb), want, rtol=1e-5, atol=1e-6)


def test_scatter_topk_and_topk_forward_kl():
  dense = lift.scatter_topk(jnp.array([[3, 1]]), jnp.array([[0.7, 0.3]]), 5)
  np.testing.assert_allclose(dense, [[0, 0.3, 0, 0.7, 0]])
  z = jnp.array([[[0.5, -1.0, 2.0, 0.0, 1.0]]])
  q = np.exp(np.asarray(z[0, 0]) / 1.5)
  q /= q.sum()
  want = 0.3 * (np.log(0.3) - np.log(q[1])) + 0.7 * (np.log(0.7) - np.log(q[3]))
  got = lift.topk_forward_kl(dense[None], z, 1.5, jnp.ones((1, 1)))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # Weighted mean over positions; zero weight ignores a position.
  two = lift.topk_forward_kl(jnp.concatenate([dense[None]] * 2, 1), jnp.concatenate([z, z * 9], 1), 1.5,
                             jnp.array([[1.0, 0.0]]))
  np.testing.assert_allclose(two, want, rtol=1e-5)


def test_fusion_matches_definition_and_adds_11_d_squared():
  dims = layers.Dims(vocab_size=V, d_model=D, n_layers=2, n_heads=2, d_ff=32)
  h = round(2.2 * D)
  fusion = lift.Fusion(dims, h)
  e, se = jax.random.normal(jax.random.PRNGKey(1), (2, 3, D)), jax.random.normal(jax.random.PRNGKey(2), (2, 3, D))
  p = nn.unbox(fusion.init(jax.random.PRNGKey(0), e, se))["params"]
  p = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(3), x.shape), p)
  rms = lambda x, g: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5) * g
  z = np.concatenate([rms(np.asarray(e), p["token_norm"]["scale"]), rms(np.asarray(se), p["state_norm"]["scale"])], -1)
  silu = lambda x: x / (1 + np.exp(-x))
  want = np.asarray(e) + (silu(z @ p["w_gate"]) * (z @ p["w_up"])) @ p["w_down"]
  np.testing.assert_allclose(fusion.apply({"params": p}, e, se), want, rtol=1e-4, atol=1e-5)
  n = sum(x.size for x in jax.tree.leaves(p))
  assert n == 5 * D * h + 2 * D
  assert abs(5 * D * h - 11 * D * D) <= 5 * D


def test_shift_states_initial_state_at_each_document_start():
  st = jnp.arange(1, 6, dtype=jnp.float32)[None, :, None] * jnp.ones((1, 5, 2))
  init = jnp.array([-1.0, -1.0])
  seg = jnp.array([[1, 1, 1, 2, 2]])
  got = np.asarray(lift.shift_states(st, init, seg))[0, :, 0]
  np.testing.assert_array_equal(got, [-1, 1, 2, -1, 4])


def test_dropout_masks():
  r = jax.random.PRNGKey(0)
  assert not lift.dropout_mask(r, 4, 6, 0.0, "sequence").any()
  assert lift.dropout_mask(r, 4, 6, 1.0, "sequence").all()
  m = np.asarray(lift.dropout_mask(r, 2000, 6, 0.3, "sequence"))
  assert (m == m[:, :1]).all() and abs(m[:, 0].mean() - 0.3) < 0.05
  pm = np.asarray(lift.dropout_mask(r, 500, 6, 1.0, "prefix"))
  assert pm[:, 0].all() and (np.diff(pm.astype(int), axis=1) <= 0).all() and not pm.all()


def _ce_kl(fam, params, b, fed):
  inputs, targets, seg, w = cross_entropy.next_token_targets(b)
  logits = fam.model.apply({"params": params}, inputs, seg, fed)
  ce, _ = cross_entropy.masked_cross_entropy(logits, targets, w)
  return ce, logits, targets, w


def test_loss_is_ce_plus_lambda_kl_on_fed_teacher_states():
  fam, params = family_and_params()
  b = batch()
  # One compile gives the loss and its gradient (a jitted loss and a jitted grad were two).
  (loss, m), g = jax.jit(jax.value_and_grad(fam.loss, has_aux=True))(params, b, jax.random.PRNGKey(0),
                                                                     jnp.asarray(0))
  inputs, targets, seg, w = cross_entropy.next_token_targets(b)
  s = jax.nn.one_hot(targets, V)  # the `labels` oracle teacher: one-hot next token
  fed = fam.model.apply({"params": params}, s, seg, None, method=lift.LiftLM.fed_states)
  # The fed state at t is s_{t-1}·E (init at t=0).
  E = params["embed"]["embedding"]
  np.testing.assert_allclose(fed[:, 1:], E[targets[:, :-1]], rtol=1e-6)
  np.testing.assert_allclose(fed[:, 0], jnp.broadcast_to(params["init_state"], (2, D)), rtol=1e-6)
  ce, logits, _, _ = _ce_kl(fam, params, b, fed)
  kl = lift.topk_forward_kl(s, logits, 1.5, w)
  np.testing.assert_allclose(loss, ce + 1.5 * kl, rtol=1e-5)
  np.testing.assert_allclose(m["kl"], kl, rtol=1e-5)
  assert float(jnp.abs(g["fusion"]["w_down"]).sum()) > 0 and float(jnp.abs(g["init_state"]).sum()) > 0


def test_state_dropout_replaces_states_by_bias():
  fam, params = family_and_params(state_dropout=1.0)
  b = batch()
  loss, m = jax.jit(fam.loss)(params, b, jax.random.PRNGKey(0), jnp.asarray(0))
  inputs, targets, seg, w = cross_entropy.next_token_targets(b)
  bias = jnp.broadcast_to(params["state_bias"], inputs.shape + (D,))
  ce, logits, _, _ = _ce_kl(fam, params, b, bias)
  np.testing.assert_allclose(m["ce"], ce, rtol=1e-5)


@pytest.mark.parametrize("n,seed", [(0, "bias"), (2, "bias"), (1, "teacher")])
def test_self_state_adaptation_trains_on_own_states_without_teacher(n, seed):
  probs = tuple(1.0 if i == n else 0.0 for i in range(3))
  fam, params = family_and_params(adapt_pass_probs=probs, adapt_fraction=0.1, adapt_seed=seed)
  b = batch()
  assert fam.adapt_start() == 90
  loss, m = jax.jit(fam.loss)(params, b, jax.random.PRNGKey(0), jnp.asarray(95))
  assert float(m["kl"]) == 0.0
  inputs, targets, seg, w = cross_entropy.next_token_targets(b)
  if seed == "bias":
    fed = jnp.broadcast_to(params["state_bias"], inputs.shape + (D,))
  else:  # the oracle teacher's states (one-hot targets) seed the first pass
    fed = fam.fed(params, jax.nn.one_hot(targets, V) * w[..., None], seg)
  for _ in range(n):
    fed = fam.fed(params, fam.own_states(params, inputs, seg, fed), seg)
  ce, _, _, _ = _ce_kl(fam, params, b, fed)
  np.testing.assert_allclose(loss, ce, rtol=1e-5)


def test_cached_feedback_equals_recomputed():
  fam, params = family_and_params(top_k=5)
  toks = batch(1, b=2, t=6)["tokens"]
  cached = jax.jit(fam.feedback_logits)(params, toks)
  ref = jax.jit(fam.recompute_feedback_logits)(params, toks)
  np.testing.assert_allclose(cached, ref, rtol=1e-4, atol=1e-5)
  # Channel off: the cached path with b equals the parallel model fed b.
  off = fam.feedback_logits(params, toks, feed="bias")
  np.testing.assert_allclose(off, fam.model.apply({"params": params}, toks, jnp.ones_like(toks)), rtol=1e-4, atol=1e-5)
  out, out_logits = fam.generate(params, toks[:, :3], 3)
  first = fam.feedback_logits(params, toks[:, :3])[:, -1]
  assert out.shape == (2, 3) and out_logits.shape == (2, 3, first.shape[-1])
  np.testing.assert_allclose(out_logits[:, 0], first, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(out[:, 0], jnp.argmax(first, -1))
  np.testing.assert_array_equal(out, jnp.argmax(out_logits, -1))


def test_lift_no_states_generates_with_the_channel_off():
  """lift_no_states is trained and used with b in every state (`inference_feed`): its decode is
  the parallel model fed b, not its own states (which it never saw in training)."""
  fam, params = family_and_params("lift_no_states", top_k=5)
  params = dict(params, state_bias=params["state_bias"] + 1.0)  # b differs from the init state
  toks = batch(1, b=2, t=6)["tokens"]
  out, logits = fam.generate(params, toks[:, :4], 2)
  full = jnp.concatenate([toks[:, :4], out[:, :1]], axis=1)
  ref = fam.model.apply({"params": params}, full, jnp.ones_like(full), None)  # b everywhere
  np.testing.assert_allclose(logits, ref[:, 3:5], rtol=1e-4, atol=1e-5)


def test_variants():
  b = batch()
  counts, metrics = {}, {}
  for variant in lift.VARIANTS:
    fam, params = family_and_params(variant)
    loss, metrics[variant] = jit_loss(variant)(params, b, jax.random.PRNGKey(0), jnp.asarray(0))
    assert np.isfinite(float(loss)), variant
    counts[variant] = fam.param_counts()["params_total"]
  assert counts["lift"] == counts["lift_no_states"] == counts["lift_rnn"]
  assert counts["lift"] - counts["distill"] == 5 * D * round(2.2 * D) + 4 * D
  # lift_no_states: CE with b everywhere; lift_rnn: CE + λ KL on its own (cached) states.
  fam, params = family_and_params("lift_rnn")
  m = metrics["lift_rnn"]
  inputs, targets, seg, w = cross_entropy.next_token_targets(b)
  own = lift.state_from_logits(fam.feedback_logits(params, inputs), 4, 1.5)
  ce, logits, _, _ = _ce_kl(fam, params, b, fam.fed(params, own, seg))
  np.testing.assert_allclose(m["ce"], ce, rtol=1e-4)


def _fake_run(tmp_path, name, config):
  workdir, fam, params = fake_run(str(tmp_path / name), config)
  return workdir, fam, params


def _tiny_task_dir(tmp_path):
  from nsl.data.tasks import s5

  d = str(tmp_path / "s5")
  s5.generate(d, train_sequences=40, val_sequences=8, max_train_len=6, heldout_per_length=4, max_eval_len=8)
  return d


def test_teacher_on_the_fly_precomputed_and_tokenizer_check(tmp_path):
  from configs import base
  from nsl.data import pipeline
  from nsl.errors import ConfigError
  from nsl.models import teacher as teacher_lib

  data = _tiny_task_dir(tmp_path)
  tc = base.get_config()
  tc.model.vocab_size, tc.model.d_model, tc.model.n_layers, tc.model.n_heads, tc.model.d_ff = 136, 16, 1, 2, 32
  tc.model.attention_impl = "xla"
  tc.data.path, tc.data.sources, tc.data.tokenizer, tc.data.seq_len = data, ("task:s5",), "task:s5", 7
  run, tfam, tparams = _fake_run(tmp_path, "teacher", tc)

  sc = tiny_config("lift", teacher=run, top_k=4)
  sc.model.vocab_size, sc.data.path, sc.data.tokenizer, sc.data.seq_len = 136, data, "task:s5", 7
  fam = lift.LiftFamily(sc)
  b = next(pipeline.make_train_iterator(data, seq_len=7, global_batch_size=2, seed=0))
  b = {k: jnp.asarray(v) for k, v in b.items()}
  inputs, targets, seg, w = cross_entropy.next_token_targets(b)
  states = fam.teacher_states(b, targets, w)
  want = lift.state_from_logits(tfam.model.apply({"params": tparams}, inputs, seg), 4, 1.5)
  np.testing.assert_allclose(states, want, rtol=1e-5, atol=1e-6)

  out = str(tmp_path / "s5_teacher")
  teacher_lib.precompute(run, data, out, seq_len=7, top_k=4, batch_size=3)
  pb = next(pipeline.make_train_iterator(out, seq_len=7, global_batch_size=2, seed=0))
  assert pb["teacher_idx"].shape == (2, 8, 4) and "labels" in pb
  np.testing.assert_array_equal(pb["tokens"], np.asarray(b["tokens"]))
  pc = tiny_config("lift", teacher="precomputed", top_k=4)
  pc.model.vocab_size = 136
  pfam = lift.LiftFamily(pc)
  pre = pfam.teacher_states({k: jnp.asarray(v) for k, v in pb.items()}, targets, w)
  np.testing.assert_allclose(pre, states, atol=2e-3)
  assert pfam.dummy_batch()["teacher_val"].shape[-1] == 4

  other = str(tmp_path / "other")
  from nsl.data import prepare
  (tmp_path / "txt").mkdir()
  (tmp_path / "txt" / "a.txt").write_text("hello world " * 20)
  prepare.prepare(other, [str(tmp_path / "txt" / "a.txt")], tokenizer="byte", val_fraction=0.0)
  bad = tiny_config("lift", teacher=run)
  bad.model.vocab_size, bad.data.path, bad.data.tokenizer = 257, other, "byte"
  with pytest.raises(ConfigError, match="tokenizer"):
    lift.LiftFamily(bad).teacher


@pytest.mark.parametrize("field,value,match", [("adapt_seed", "oracle", "adapt_seed"), ("state_dropout", 1.5, "state_dropout"),
                                               ("adapt_pass_probs", (0.5, 0.5, 0.5), "adapt_pass_probs"),
                                               ("eval_feed", "oracle", "eval_feed")])
def test_bad_lift_fields_are_config_errors(field, value, match):
  from nsl.errors import ConfigError

  with pytest.raises(ConfigError, match=match):
    lift.LiftFamily.validate(tiny_config(**{field: value}))


# -- packed documents and LIFT-family teachers (issue 15) ----------------------------------------
def loud(params, scale=0.3, seed=3):
  """Parameters whose state channel matters (at init the fusion moves the logits by ~1e-2)."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def loud_run(workdir, config):
  """A run dir like tests.helpers.fake_run, with `loud` parameters: (workdir, family, params)."""
  from tests.helpers import fake_run

  return fake_run(workdir, config, seed=7, transform=loud)


SEGMENTS = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 2, 2, 3]], np.int32)


def packed_batch(seed=0, vocab=V):
  rng = np.random.default_rng(seed)
  return {"tokens": jnp.asarray(rng.integers(0, vocab - 1, SEGMENTS.shape).astype(np.int32)),
          "segment": jnp.asarray(SEGMENTS)}


def per_document(fn, inputs, seg):
  """fn(tokens [1, n]) -> [1, n, ...] applied to every document of every row alone, reassembled."""
  rows = []
  for r in range(inputs.shape[0]):
    s = np.asarray(seg[r])
    rows.append(jnp.concatenate([fn(inputs[r:r + 1, s == d])[0] for d in np.unique(s)], 0))
  return jnp.stack(rows)


def test_lift_rnn_training_keeps_packed_documents_apart():
  fam, params = family_and_params("lift_rnn")
  params = loud(params)
  b = packed_batch()
  inputs, targets, seg, w = cross_entropy.next_token_targets(b)
  train_logits = jax.jit(lambda toks, sg: fam.model.apply({"params": params}, toks, sg,
                                                          fam.rnn_fed_states(params, toks, sg)))
  base = train_logits(inputs, seg)
  changed = inputs.at[0, 1].set((inputs[0, 1] + 1) % (V - 1))  # a document-1 token of row 0
  moved = train_logits(changed, seg)
  doc2 = np.asarray(seg[0]) == 2
  np.testing.assert_allclose(moved[0, doc2], base[0, doc2], rtol=0, atol=1e-5)
  assert float(jnp.abs(moved[0, 1:4] - base[0, 1:4]).max()) > 1e-2  # document 1 itself does move
  # Every document is trained exactly as if it were alone in its row (initial state at its start).
  alone = per_document(lambda t: train_logits(t, jnp.ones_like(t)), inputs, seg)
  np.testing.assert_allclose(base, alone, rtol=1e-4, atol=1e-5)
  _, m = jit_loss("lift_rnn")(params, b, jax.random.PRNGKey(0), jnp.asarray(0))
  np.testing.assert_allclose(m["ce"], cross_entropy.masked_cross_entropy(base, targets, w)[0], rtol=1e-5)
  # The sequential pass it is fed is the inference decode, document by document.
  fb = fam.feedback_logits(params, inputs, segment_BT=seg)
  # The reference jitted per document length: eagerly its T forwards were most of this test's time.
  recompute = functools.partial(jax.jit(fam.recompute_feedback_logits), params)
  np.testing.assert_allclose(fb, per_document(recompute, inputs, seg),
                             rtol=1e-4, atol=1e-4)


def test_eval_feeds():
  fam, params = family_and_params("lift")
  params = loud(params)
  b = packed_batch(1)
  inputs, targets, seg, w = cross_entropy.next_token_targets(b)
  own = fam.token_logits(params, b)
  np.testing.assert_allclose(own, fam.feedback_logits(params, inputs, segment_BT=seg), rtol=1e-6)
  teacher = fam.token_logits(params, b, feed="teacher")
  np.testing.assert_allclose(teacher, _ce_kl(fam, params, b, fam.fed(params, jax.nn.one_hot(targets, V) * w[..., None], seg))[1],
                             rtol=1e-5)
  bias = fam.token_logits(params, b, feed="bias")
  np.testing.assert_allclose(bias, fam.model.apply({"params": params}, inputs, seg), rtol=1e-6)
  for view, want in zip(fam.views(), (own, teacher, bias)):  # the named views are the feeds
    np.testing.assert_array_equal(fam.view_logits(params, b, view), want)
  nlls = {f: float(fam.eval_nll(params, b, f)[0]) for f in lift.EVAL_FEEDS}
  assert len(set(nlls.values())) == 3
  # The trainer's eval: own states by default (eval_val_nll), or lift.eval_feed under its own key.
  from nsl.train import step as step_lib
  assert fam.view_suffix(fam.eval_view()) == "" and float(step_lib.make_eval_step(fam)(params, b)[0]) == pytest.approx(nlls["own"], rel=1e-6)
  fam_t, _ = family_and_params("lift", eval_feed="teacher")
  assert fam_t.view_suffix(fam_t.eval_view()) == "_feed_teacher"
  assert float(step_lib.make_eval_step(fam_t)(params, b)[0]) == pytest.approx(nlls["teacher"], rel=1e-6)
  # lift_no_states is used with b at inference, so its "own" feed is b; distill has no channel.
  fam_ns, _ = family_and_params("lift_no_states")
  np.testing.assert_allclose(fam_ns.token_logits(params, b), bias, rtol=1e-6)
  fam_d, params_d = family_and_params("distill")
  np.testing.assert_allclose(fam_d.token_logits(params_d, b, feed="teacher"), fam_d.token_logits(params_d, b))


def test_lift_rnn_teacher_states_are_its_own_feedback(tmp_path):
  from nsl.data import pipeline
  from nsl.models import teacher as teacher_lib

  data = _tiny_task_dir(tmp_path)
  tc = tiny_config("lift_rnn", top_k=4)
  tc.model.vocab_size, tc.data.path, tc.data.sources, tc.data.tokenizer = 136, data, ("task:s5",), "task:s5"
  run, tfam, tparams = loud_run(str(tmp_path / "lift_rnn"), tc)

  sc = tiny_config("lift", teacher=run, top_k=4)
  sc.model.vocab_size, sc.data.path, sc.data.tokenizer = 136, data, "task:s5"
  fam = lift.LiftFamily(sc)
  b = packed_batch(2, vocab=136)
  inputs, targets, seg, w = cross_entropy.next_token_targets(b)
  states = fam.teacher_states(b, targets, w)
  own = per_document(lambda t: tfam.feedback_logits(tparams, t), inputs, seg)  # each document decoded alone
  np.testing.assert_allclose(states, lift.state_from_logits(own, 4, 1.5), rtol=1e-4, atol=1e-5)
  bias_fed = lift.state_from_logits(tfam.model.apply({"params": tparams}, inputs, seg), 4, 1.5)
  assert float(jnp.abs(states - bias_fed).max()) > 1e-2
  # A fresh family first meets its teacher inside the jitted loss (as the trainer does).
  loss, m = jax.jit(lift.LiftFamily(sc).loss)(params_of(sc), b, jax.random.PRNGKey(0), jnp.asarray(0))
  assert np.isfinite(float(loss)) and float(m["kl"]) > 0

  # precompute goes through the same Teacher.logits
  out = str(tmp_path / "s5_lift_rnn_states")
  teacher_lib.precompute(run, data, out, seq_len=8, top_k=4, batch_size=3)
  pb = {k: jnp.asarray(v) for k, v in next(pipeline.make_train_iterator(out, seq_len=8, global_batch_size=2, seed=0)).items()}
  pc = tiny_config("lift", teacher="precomputed", top_k=4)
  pc.model.vocab_size = 136
  _, pt, _, pw = cross_entropy.next_token_targets(pb)
  pre = lift.LiftFamily(pc).teacher_states(pb, pt, pw)
  fly = fam.teacher_states({"tokens": pb["tokens"], "segment": pb["segment"]}, pt, pw)
  np.testing.assert_allclose(pre, fly, atol=2e-3)


def test_cached_feedback_keeps_the_sliding_window():
  c = tiny_config("lift", top_k=5)
  c.model.window = 2
  fam = lift.LiftFamily(c)
  params = loud(nn.unbox(jax.jit(fam.init)(jax.random.PRNGKey(0))))  # jitted: eager init compiles op by op
  toks = batch(3, b=2, t=7)["tokens"]
  np.testing.assert_allclose(jax.jit(fam.feedback_logits)(params, toks),
                             jax.jit(fam.recompute_feedback_logits)(params, toks), rtol=1e-4, atol=1e-4)


def test_cached_feedback_with_scanned_layers():
  """A trunk stored scanned (`trunk/layers`) feeds back through the same shared cached trunk (the
  old per-layer decode read `trunk/block_i` and could not run it)."""
  c = tiny_config("lift", top_k=5)
  c.model.scan_layers = True
  fam = lift.LiftFamily(c)
  params = nn.unbox(jax.jit(fam.init)(jax.random.PRNGKey(0)))  # jitted: eager, the scanned init is many compiles
  assert "layers" in params["trunk"]
  toks = batch(2, b=2, t=6)["tokens"]
  np.testing.assert_allclose(jax.jit(fam.feedback_logits)(params, toks),
                             jax.jit(fam.recompute_feedback_logits)(params, toks), rtol=1e-4, atol=1e-5)


def test_feedback_decode_reads_each_layers_kv_in_place():
  """The own-state token loop runs on per-layer weights and K/V (`KVCache.per_layer`, as
  `nsl.decode.decode_loop`): inside the compiled loop no layer's K or V buffer is copied and the
  only values that large are one in-place update of each per layer (a layer scan copied each
  layer's K/V slice before reading it: a d 512 x 8-layer feedback decode 1.3x slower)."""
  from tests import hlo as hlo_text

  fam, params = family_and_params(top_k=5)
  prompt = batch(1, b=2, t=6)["tokens"]
  hlo = lift._generate.lower(fam.dims, fam.spec, fam.model, params, prompt, 3).compile().as_text()
  d = fam.dims
  k_l, v_l = (2, d.n_heads, d.head_dim, 9), (2, d.n_heads, 9, d.head_dim)  # rows, heads, prompt + new slots
  assert "while" in hlo and not hlo_text.copies_outside_entry(hlo, {hlo_text.shape(k_l), hlo_text.shape(v_l)})
  big = hlo_text.large_values_in_loops(hlo, int(np.prod(k_l)))
  if 'custom_call_target="nsl_decode_cpu_write"' in hlo:
    # The CPU decode kernel takes this head size on this host (it depends on the SIMD width): it
    # writes each layer's new K/V into the aliased cache itself, one call per layer, so the loop
    # materialises no cache-sized value at all.
    assert hlo.count('custom_call_target="nsl_decode_cpu_write"') == d.n_layers and big == [], big
  else:
    assert big.count(hlo_text.shape(k_l)) == big.count(hlo_text.shape(v_l)) == d.n_layers, big
