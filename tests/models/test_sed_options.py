"""SED's options in one home (`nsl.models.sed.SEDSpec`, issue #18): defaults declared there, read
once from the loose `config.model` fields, every bad value one ConfigError naming the field."""

import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError
from nsl.models import registry
from nsl.models.sed import SEDSpec


def test_spec_reads_the_configs_fields_and_defaults_the_missing_ones():
  c = nsl_config.load_config("configs/dd.py:sed_tiny")
  assert SEDSpec.from_config(c) == SEDSpec(noise_density=0.15, mean_span=4.0, sentinels=100, gen_layers=1)
  for field in ("noise_density", "mean_span", "sentinels", "gen_layers"):
    del c.model[field]
  assert SEDSpec.from_config(c) == SEDSpec()  # T5's 0.15 / 4 / 100, decoder n_layers // 3
  family = registry.get_family(c)
  assert family.split() == (2, 1) and family.sentinels == 100 and family.corruption == (0.15, 4.0)


@pytest.mark.parametrize("field,value,match", [
    ("model.noise_density", "1.0", "config.model.noise_density=1.0 must be in"),
    ("model.mean_span", "0.0", "config.model.mean_span=0.0 must be positive"),
    ("model.gen_layers", "3", r"config.model.gen_layers=3 \(decoder layers\) must be in \[1"),
    ("model.sentinels", "200", "config.model.vocab_size=4224 leaves no room for the 200 sentinels"),
    ("model.sentinels", "2", "gives 5 noise spans, more than model.sentinels=2"),
])
def test_bad_sed_options_name_the_field(field, value, match):
  c = nsl_config.load_config("configs/dd.py:sed_tiny", [(field, value)])
  with pytest.raises(ConfigError, match=match):
    nsl_config.validate(c)
