"""The Family interface every evaluation reads (nsl/models/family.py): each registered family
implements `token_logits`, `rule`, `layout`, `with_rule`, `views` and `eval_nll`, and its
`token_logits` are the next-token logits its own loss and eval step score, causal in the inputs."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError, NslError
from nsl.models import registry
from nsl.nn import cross_entropy, masks
from nsl.models.family import Family

# One tiny config per registered family (a new family needs one here); `load_config` resolves
# the per-size paths to the family files that replace them (configs/aliases.py).
CONFIGS = {"standard": "standard_tiny", "sps": "sps_tiny", "lift": "lift_tiny", "nextlat": "nextlat_tiny",
           "mtp": "mtp_tiny", "double_decoder": "dd_tiny", "sed": "sed_tiny"}
V, T, B = 400, 16, 2  # byte ids < 257; SED's 100 sentinels and start id fit below 400


def _config(name: str, **overrides):
  c = nsl_config.load_config(f"configs/{CONFIGS[name]}.py")
  c.data.tokenizer, c.data.seq_len = "byte", T
  c.model.vocab_size, c.model.d_model, c.model.n_layers, c.model.n_heads, c.model.d_ff = V, 64, 3, 2, 64
  c.model.attention_impl = "xla"
  if name == "lift":
    c.lift.state_dropout = 0.0  # the teacher phase's CE is then exactly token_logits(feed='teacher')'s
  for key, value in overrides.items():
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = value
  nsl_config.validate(c)
  return c


def _batch(seed: int = 0):
  """Row 0 one document; row 1 two documents (segments given, so EOS ids do not matter)."""
  tokens = np.random.default_rng(seed).integers(1, 257, (B, T + 1)).astype(np.int32)
  segment = np.array([[1] * (T + 1), [1] * 6 + [2] * (T - 5)], np.int32)
  return {"tokens": jnp.asarray(tokens), "segment": jnp.asarray(segment)}


@pytest.fixture(scope="module", params=sorted(registry.FAMILIES))
def built(request):
  family = registry.get_family(_config(request.param))
  return family, nn.unbox(jax.jit(family.init)(jax.random.PRNGKey(1)))  # jitted: eager init compiles op by op


def _ce(logits, batch):
  _, targets, _, weights = cross_entropy.next_token_targets(batch)
  return cross_entropy.masked_cross_entropy(logits, targets, weights)


def test_every_registered_family_has_a_tiny_config():
  assert set(CONFIGS) == set(registry.FAMILIES)


def test_every_family_implements_the_hooks(built):
  family, _ = built
  cls = type(family)
  assert cls.token_logits is not Family.token_logits, f"{family.name} does not implement token_logits"
  assert isinstance(family.rule, masks.Rule)
  lay = family.layout(T)
  assert isinstance(lay, masks.Layout) and lay.num_slots in (T, 2 * T)
  assert sorted(np.unique(np.asarray(lay.tok)).tolist()) == list(range(T))  # every token has its slots
  views = family.views()
  assert isinstance(views, tuple) and views and family.eval_view() in views and family.view_suffix(views[0]) == ""


def test_token_logits_shape_and_the_eval_step(built):
  family, params = built
  batch = _batch()
  logits = jax.jit(lambda p, b: family.token_logits(p, b))(params, batch)
  assert logits.shape == (B, T, V) and bool(jnp.all(jnp.isfinite(logits)))
  s, n = jax.jit(family.eval_nll)(params, batch)
  if family.name == "sed":  # SED's eval scores its corrupted spans, not next tokens
    return
  ce, w = _ce(logits, batch)
  assert float(n) == float(w) == float(cross_entropy.next_token_targets(batch)[3].sum())
  np.testing.assert_allclose(float(s) / float(n), float(ce), rtol=1e-5)


def test_the_loss_is_scored_on_token_logits(built):
  """The CE term of `family.loss` at a random step rng is the CE of `token_logits` (with the
  options that loss uses: the double decoder's blocks of that rng, LIFT's teacher feed)."""
  family, params = built
  if family.name == "sed":
    pytest.skip("SED's loss is over corrupted spans; its token_logits read the decoder on whole-document spans")
  batch, rng = _batch(1), jax.random.PRNGKey(5)
  loss, metrics = jax.jit(family.loss)(params, batch, rng, jnp.zeros((), jnp.int32))
  options = {}
  if family.name == "double_decoder":
    options["block_BT"] = family.loss_blocks(rng, T)
  if family.name == "lift":  # variant lift at step 0: the teacher phase, fed the teacher's states
    options["feed"] = "teacher"
  ce, _ = _ce(jax.jit(lambda p, b: family.token_logits(p, b, **options))(params, batch), batch)
  np.testing.assert_allclose(float(metrics.get("ce", loss)), float(ce), rtol=1e-5)


def test_token_logits_are_causal(built):
  """Row t predicts target t from inputs <= t: changing later tokens leaves rows <= t alone."""
  family, params = built
  batch, cut = _batch(2), 9
  changed = dict(batch, tokens=batch["tokens"].at[:, cut + 1:].set(7))
  fwd = jax.jit(lambda p, b: family.token_logits(p, b))
  a, b = np.asarray(fwd(params, batch)), np.asarray(fwd(params, changed))
  np.testing.assert_allclose(a[:, :cut + 1], b[:, :cut + 1], atol=1e-5)
  assert not np.allclose(a[:, cut + 1:], b[:, cut + 1:])


def test_with_rule_replaces_the_rule_or_says_why_not(built):
  family, params = built
  if family.name in ("double_decoder", "sed"):
    with pytest.raises(NslError, match="no single rule"):
      family.with_rule(family.rule)
    return
  batch = _batch(3)
  logits = lambda model=None: jax.jit(lambda p, b: family.token_logits(p, b, model=model))(params, batch)
  same = logits(family.with_rule(family.rule))
  np.testing.assert_array_equal(same, logits())
  narrow = logits(family.with_rule(masks.Rule(causal=True, same_segment=True, persistent_window=1)))
  assert not np.allclose(narrow, same)


def test_every_family_generates_or_says_it_has_no_decoder(built):
  """`family.generate` is each family's decoder (the shared KV cache, LIFT's feedback, the double
  decoder's): 2 greedy tokens per row, each the argmax of the logits returned for it. A family
  with none (SED) raises the decoder's one-line ConfigError, and so does its `slot_plan`."""
  family, params = built
  prompt = _batch()["tokens"][:, :5]
  if family.decoder() is None:  # SED
    for call, says in ((lambda: family.generate(params, prompt, 2), "has none"), (family.slot_plan, "no KV-cache")):
      with pytest.raises(ConfigError, match=f"{says}.*") as err:
        call()
      assert "\n" not in str(err.value) and repr(family.name) in str(err.value)
    return
  toks, logits = family.generate(params, prompt, 2)
  assert toks.shape == (B, 2) and toks.dtype == jnp.int32 and logits.shape == (B, 2, V)
  assert bool(jnp.all(jnp.isfinite(logits)))
  np.testing.assert_array_equal(toks, jnp.argmax(logits, -1))
  if family.decoder().streams and family.name != "double_decoder":  # the shared KV cache: a group per token
    assert family.slot_plan().group == family.layout(T).num_slots // T


def test_only_nextlat_drafts_with_its_dynamics_model():
  """Self-speculative decoding (nsl.speculative) asks the family's decoder: NextLat's p_ψ, not its gpt baseline."""
  for name in set(registry.FAMILIES) - {"nextlat"}:
    decoder = registry.get_family(_config(name)).decoder()
    assert decoder is None or decoder.speculative is None, name
  for variant in ("nextlat", "gpt"):
    family = registry.get_family(_config("nextlat", **{"model.variant": variant}))
    assert (family.decoder().speculative is not None) == (variant == "nextlat")


def test_lift_names_its_feeds_as_views_and_others_have_one():
  for name in registry.FAMILIES:
    family = registry.get_family(_config(name))
    assert family.views() == (("own", "teacher", "bias") if name == "lift" else ("own",)), name
    with pytest.raises(ConfigError, match="--view=nope.*views") as err:
      family.view("nope", "--view")
    assert "\n" not in str(err.value)


def test_mtp_validates_its_own_options_once():
  c = _config("mtp")
  assert "nextlat" not in c.model  # MTP needs no NextLat section ...
  with pytest.raises(ConfigError, match="mtp.horizon"):
    _config("mtp", **{"mtp.horizon": 0})
  with pytest.raises(ConfigError, match="not a variant"):  # ... and the base check still runs
    _config("mtp", **{"model.variant": "nextlat"})
  with pytest.raises(ConfigError, match="nextlat.horizon"):
    _config("nextlat", **{"nextlat.horizon": 0})
