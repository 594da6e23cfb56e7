"""Every config in configs/ (each file, and each ARG of a file that takes one) loads and
validates: a broken config fails here, not on a pod."""

import glob
import os

import pytest

from nsl import config as nsl_config
from tests.helpers import ROOT

FILES = sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "*.py")) if "def get_config" in open(p).read())
FOLDED = {os.path.join(ROOT, "configs", f"{family}.py"): names for family, names in nsl_config.folded().items()}
CONFIGS = [f"{p}:{name}" for p in FILES for name in FOLDED.get(p, ())] + [p for p in FILES if p not in FOLDED]


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p)[:-3] if p.endswith(".py") else
                                               os.path.basename(p).replace(".py:", ":") for p in CONFIGS])
def test_config_loads_and_validates(path):
  c = nsl_config.load_config(path)
  nsl_config.validate(c)
  assert c.family and c.model.n_layers >= 1 and c.train.steps >= 1
