"""The SPS paper configs start from the SPS authors' initialisation (docs/xcheck/sps.md)."""

import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from nsl import config as nsl_config
from nsl.models import registry


def _stds(spec, overrides=()):
  config = nsl_config.load_config(spec, list(overrides))
  params = nn.unbox(registry.get_family(config).init(jax.random.PRNGKey(0)))
  block = params["trunk"]["block_0"]
  std = lambda x: float(np.asarray(x).std())
  return config, std(block["mlp"]["w_down"]), std(block["attn"]["wo"]), std(block["mlp"]["w_up"])


@pytest.mark.parametrize("spec", ["configs/sps.py:sps_tiny", "configs/sps.py:standard_tiny"])
def test_paper_configs_leave_the_mlp_down_projection_unscaled(spec):
  """Their SwiGLU down_proj is drawn at init_std like every Linear; only the attention output
  (their c_proj) gets GPT-2's 1/sqrt(2·layers)."""
  config, down, wo, up = _stds(spec)
  std, scaled = config.model.init_std, config.model.init_std / math.sqrt(2 * config.model.n_layers)
  assert down == pytest.approx(std, rel=0.05) and up == pytest.approx(std, rel=0.05)
  assert wo == pytest.approx(scaled, rel=0.05)


def test_the_earlier_init_is_an_option():
  _, down, wo, _ = _stds("configs/sps.py:sps_tiny", [("model.scaled_mlp_out_init", "true")])
  assert down == pytest.approx(wo, rel=0.05) and down < 0.01


def test_trunk_default_still_scales_both():
  """configs/base.py (every other family) keeps GPT-2's scaling of both output projections."""
  config = nsl_config.load_config("configs/tiny.py")
  params = nn.unbox(registry.get_family(config).init(jax.random.PRNGKey(0)))
  block = params["trunk"]["block_0"]
  scaled = config.model.init_std / math.sqrt(2 * config.model.n_layers)
  assert float(np.asarray(block["mlp"]["w_down"]).std()) == pytest.approx(scaled, rel=0.05)
