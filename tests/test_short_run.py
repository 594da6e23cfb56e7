"""Shortening a recipe (docs/guide/paper_size.md#shorten): a `train.steps` too short for the
recipe's warmup and decay is refused with the exact overrides that make it valid, and those
overrides do."""

import os
import re

import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(spec: str, **fields):
  return nsl_config.load_config(os.path.join(ROOT, spec), [(k, str(v)) for k, v in fields.items()])


@pytest.mark.parametrize("spec, steps", [("configs/sps.py:sps_xs", 100), ("configs/tiny.py", 50),
                                         ("configs/dd.py:dd_6m", 300)])
def test_the_error_names_the_overrides_that_make_a_short_run_valid(spec, steps):
  with pytest.raises(ConfigError) as e:
    nsl_config.validate(_load(spec, **{"train.steps": steps}))
  flags = dict(re.findall(r"--config\.(train\.\w+)=(\d+)", str(e.value)))
  assert flags and set(flags) <= {"train.warmup_steps", "train.decay_steps"}, str(e.value)
  config = _load(spec, **{"train.steps": steps}, **flags)
  nsl_config.validate(config)  # the hint's overrides are enough
  assert config.train.warmup_steps + config.train.decay_steps <= steps


def test_the_page_gives_the_errors_overrides():
  with pytest.raises(ConfigError) as e:
    nsl_config.validate(_load("configs/sps.py:sps_xs", **{"train.steps": 100}))
  flags = " ".join(re.findall(r"--config\.train\.\w+=\d+", str(e.value)))
  assert flags == "--config.train.warmup_steps=10 --config.train.decay_steps=20"
  with open(os.path.join(ROOT, "docs", "guide", "paper_size.md"), encoding="utf-8") as f:
    assert flags in f.read()
