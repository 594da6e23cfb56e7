"""A family is a plug-in (docs/design.md#families, issue #55): one defined here alone, registered
through `nsl.models.registry.register`, has its options mounted in the config, trains with a config
evaluator, generates with `nsl.generate`, is scored by `nsl.evals.nll` and runs through lm-eval's
model class, and no module under nsl/ names it."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import ROOT, short_run, tiny_config
from nsl.models import registry
from nsl.models.decoder import Decoder
from nsl.models.family import Family
from nsl.nn import cross_entropy, layers, masks

NAME = "toy_bigram_plugin"


class Bigram(nn.Module):
  """Logits of the next token from the current one alone: nsl's tied embedding, in and out."""

  dims: layers.Dims

  def setup(self):
    self.embed = layers.Embedder(self.dims)

  def __call__(self, tokens_BT, segment_BT):
    del segment_BT  # a bigram sees no other token, so no document boundary
    return self.embed.decode(self.embed.encode(tokens_BT))


@dataclasses.dataclass(frozen=True)
class BigramOptions:
  logit_temperature: float = 1.0  # the logits are divided by it


class BigramFamily(Family):
  name = NAME
  variants = ("bigram",)
  options = BigramOptions

  def make_model(self):
    return Bigram(self.dims)

  def model_inputs(self, batch):
    inputs, _, seg_in, _ = cross_entropy.next_token_targets(batch)
    return inputs, seg_in

  @property
  def rule(self):
    return masks.Rule(causal=True, same_segment=True)

  def token_logits(self, params, batch, *, model=None):
    logits = (model or self.model).apply({"params": params}, *self.model_inputs(batch))
    return logits / self.options_of(self.config).logit_temperature

  def loss(self, params, batch, rng, step):
    _, targets, _, weights = cross_entropy.next_token_targets(batch)
    loss, weight = cross_entropy.masked_cross_entropy(self.token_logits(params, batch), targets, weights)
    return loss, {"weight": weight}

  def flops_per_token(self):
    return 6.0 * self.param_counts()["params_total"]

  def decoder(self):
    """The last token is the whole state: prefill reads it, each step the new one."""
    from nsl import decode

    logits_of = lambda p, tok_B: self.model.apply({"params": p}, tok_B[:, None], jnp.ones_like(tok_B[:, None]))[:, 0]
    prefill = lambda p, prompt_BN, new: (logits_of(p, jnp.asarray(prompt_BN)[:, -1]), None)
    step = lambda p, state, tok_B, k: (logits_of(p, tok_B), state)

    def generate(p, prompt_BN, new, *, temperature=0.0, rng=None):
      keys = jax.random.split(jax.random.PRNGKey(0) if rng is None else rng, new)
      logits, _ = prefill(p, prompt_BN, new)
      toks, all_logits = [], []
      for k in range(new):
        tok = decode.sample(logits, keys[k], temperature)
        toks.append(tok)
        all_logits.append(logits)
        logits, _ = step(p, None, tok, k)
      return jnp.stack(toks, 1), jnp.stack(all_logits, 1)

    return Decoder(generate=generate, prefill=prefill, step=step)


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory):
  registry.register(NAME, BigramFamily)
  tmp = tmp_path_factory.mktemp("plugin")

  def make_config(data_dir, **overrides):
    c = tiny_config(data_dir, **overrides)
    c.family, c.model.variant = NAME, "bigram"
    c.evals = {"heldout": {"kind": "nll", "data": data_dir, "batches": 1}}  # a config evaluator, every eval
    return c

  result = short_run(tmp, make_config)
  yield str(tmp / "run"), result
  registry.FAMILIES.pop(NAME)


def test_a_family_defined_in_a_test_trains_generates_and_is_scored(plugin_run, capsys):
  from nsl import generate
  from nsl.evals import lm_eval_model, nll

  run, result = plugin_run
  with open(os.path.join(run, "result.json")) as f:
    recorded = json.load(f)
  with open(os.path.join(run, "metrics.jsonl")) as f:
    lines = [json.loads(line) for line in f if "heldout/nll" in line]
  assert recorded["family"] == NAME and lines and np.isfinite(lines[-1]["heldout/nll"]), lines
  assert generate.main(["--run", run, "--prompt", "The state", "--max_new_tokens", "4", "--ignore_eos"]) == 0
  assert json.loads(capsys.readouterr().err.strip().splitlines()[-1])["new_tokens"] == 4
  assert nll.main(["--workdir", run, "--max_batches", "1"]) == 0
  scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["eval"]["val"]
  assert abs(scored - recorded["eval"]["val"]) < 0.05, (scored, recorded["eval"])  # one batch of the trainer's eval set
  lm = lm_eval_model.NslLM(run=run, batch_size=2)
  ((ll, _),) = lm([("The state of the", " Union")])
  assert np.isfinite(ll) and ll < 0
  (text,) = lm.generate_until([SimpleNamespace(args=("The state", {"until": ["\x00"], "max_gen_toks": 3}))])
  assert isinstance(text, str)


def test_the_plugins_options_are_in_the_config_and_on_the_command_line(plugin_run):
  from nsl import config as nsl_config
  from nsl.errors import ConfigError

  run, _ = plugin_run
  with open(os.path.join(run, "config.json")) as f:
    assert json.load(f)[NAME] == {"logit_temperature": 1.0}
  c = nsl_config.load_config("configs/base.py", [("family", NAME), ("model.variant", "bigram"),
                                                  (f"{NAME}.logit_temperature", "2")])
  nsl_config.validate(c)
  assert BigramFamily.options_of(c) == BigramOptions(logit_temperature=2.0)
  with pytest.raises(ConfigError, match=f"did you mean '{NAME}.logit_temperature'"):
    nsl_config.load_config("configs/base.py", [(f"{NAME}.logit_temprature", "2")])


def test_no_module_under_nsl_names_the_plugin():
  for base, _, files in os.walk(os.path.join(ROOT, "nsl")):
    for name in files:
      if name.endswith(".py"):
        with open(os.path.join(base, name), encoding="utf-8") as f:
          text = f.read()
        assert NAME not in text and "BigramFamily" not in text, os.path.join(base, name)
