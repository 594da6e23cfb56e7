"""Every config file in configs/ loads and validates: a broken config fails here, not on a pod."""

import glob
import os

import pytest

from nsl import config as nsl_config
from tests.helpers import ROOT

CONFIGS = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "*.py"))
                 if "def get_config" in open(p).read())


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p)[:-3] for p in CONFIGS])
def test_config_loads_and_validates(path):
  c = nsl_config.load_config(path)
  nsl_config.validate(c)
  assert c.family and c.model.n_layers >= 1 and c.train.steps >= 1
