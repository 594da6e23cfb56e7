"""Self-speculative decoding: greedy output equals plain greedy decoding token for token; the
KV-cache forward matches the training forward; sampling acceptance keeps valid tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.errors import ConfigError

from configs import nextlat as nextlat_configs
from nsl import decode, speculative
from nsl.models import registry


def _family(**nextlat):
  c = nextlat_configs.get_config("nextlat_tiny")
  c.model.vocab_size = 64
  c.model.d_model = 32
  c.model.n_layers = 2
  c.model.n_heads = 2
  c.model.d_ff = 64
  c.data.seq_len = 32
  for k, v in nextlat.items():
    c.nextlat[k] = v
  c.nextlat.hidden = 32
  fam = registry.get_family(c)
  import flax.linen as nn
  params = nn.unbox(fam.init(jax.random.PRNGKey(1)))
  # A sharper model than the random init so that drafts are sometimes accepted.
  params["embed"]["embedding"] = params["embed"]["embedding"] * 40.0
  return fam, params


@pytest.fixture(scope="module")
def fam_params():
  return _family(draft_len=3)


def test_cached_forward_matches_model(fam_params):
  """The shared cached trunk (nsl.decode) on nextlat's LatentLM: prefill + a multi-token step,
  and multi-token steps from an empty cache, equal the training forward's hidden states; a step
  overwrites entries left by a longer earlier one (a rejected draft) without seeing them."""
  fam, params = fam_params
  dims, plan = fam.dims, fam.slot_plan()
  toks = jax.random.randint(jax.random.PRNGKey(2), (1, 12), 0, 64)
  # jitted (one compile per call shape): eagerly, every primitive of the scans compiles alone
  hidden = jax.jit(lambda p, t: fam.model.apply({"params": p}, t, jnp.ones_like(t), method="hidden"))
  prefill_hidden = jax.jit(decode.prefill_hidden, static_argnums=(0, 1, 4))
  extend = jax.jit(decode.extend, static_argnums=(0, 1))
  ref = hidden(params, toks)
  h0, cache = prefill_hidden(dims, plan, params, toks[:, :7], 16)
  np.testing.assert_allclose(h0, ref[:, 6], atol=2e-4, rtol=2e-4)
  h2, _ = extend(dims, plan, params, cache, toks[:, 7:], jnp.int32(7))
  np.testing.assert_allclose(h2, ref[:, 7:], atol=2e-4, rtol=2e-4)
  cache = decode.init_cache(dims, plan, 1, 16)
  h1, cache = extend(dims, plan, params, cache, toks[:, :7], jnp.int32(0))
  _, stale = extend(dims, plan, params, cache, jnp.zeros((1, 4), jnp.int32), jnp.int32(7))
  h2, _ = extend(dims, plan, params, stale, toks[:, 7:], jnp.int32(7))
  np.testing.assert_allclose(np.concatenate([h1, h2], 1), ref, atol=2e-4, rtol=2e-4)


def test_greedy_speculative_equals_plain_greedy(fam_params):
  fam, params = fam_params
  dec = speculative.Decoder(fam, params, draft_len=3)
  prompt = np.array([3, 1, 4, 1, 5, 9, 2, 6], np.int32)
  plain = dec.generate(prompt, 20)
  spec, stats = dec.generate_speculative(prompt, 20)
  np.testing.assert_array_equal(plain, spec)
  assert stats["rounds"] >= 1 and all(0 <= a <= 3 for a in stats["accepted"])
  # and plain cached greedy equals uncached greedy with the training forward
  seq = jnp.asarray(prompt)[None]
  forward = jax.jit(lambda p, s: fam.model.apply({"params": p}, s, jnp.ones_like(s)))
  for t in plain[:6]:
    logits = forward(params, seq)
    assert int(jnp.argmax(logits[0, -1])) == int(t)
    seq = jnp.concatenate([seq, jnp.asarray([[t]], jnp.int32)], axis=1)


def test_sampling_and_measure(fam_params):
  fam, params = fam_params
  dec = speculative.Decoder(fam, params, draft_len=3, temperature=1.0)
  out, stats = dec.generate_speculative(np.arange(5, dtype=np.int32), 12, jax.random.PRNGKey(3))
  assert out.shape == (12,) and out.min() >= 0 and out.max() < 64
  r = speculative.measure(fam, params, [np.arange(6, dtype=np.int32)], new_tokens=8, draft_len=2)
  assert r["speculative"]["greedy_match"] is True
  assert 1.0 <= r["speculative"]["mean_tokens_per_draft"] <= 3.0
  assert r["plain"]["tokens_per_s"] > 0


def test_needs_dynamics():
  c = nextlat_configs.get_config("nextlat_tiny")
  c.model.variant = "gpt"
  fam = registry.get_family(c)
  assert fam.decoder().speculative is None  # its decoder has no draft model to offer
  with pytest.raises(ConfigError, match="dynamics") as err:
    speculative.drafter(fam)
  assert "\n" not in str(err.value) and "'nextlat'" in str(err.value)
