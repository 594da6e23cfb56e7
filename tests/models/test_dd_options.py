"""The options of the double-decoder paper's families in one home each (issue #18): SED's
`nsl.models.sed.SEDSpec` and the double decoder's `nsl.models.double_decoder.DDSpec`, defaults
declared there, read once from the loose `config.model` fields, every bad value one ConfigError."""

import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError
from nsl.models import registry
from nsl.models.double_decoder import DDSpec
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


def test_dd_spec_reads_the_configs_fields_and_defaults_the_missing_ones():
  c = nsl_config.load_config("configs/dd.py:dd_tiny")
  assert DDSpec.from_config(c) == DDSpec(gen_layers=1, dd_cross_kv="shared")
  del c.model["gen_layers"], c.model["dd_cross_kv"]
  assert DDSpec.from_config(c) == DDSpec()
  family = registry.get_family(c)
  assert not family.separate_cross_kv and family.make_model().gen_layers == 3 // 3


@pytest.mark.parametrize("field,value,match", [
    ("model.gen_layers", "3", r"config.model.gen_layers=3 must be in \[1, model.n_layers-1=2\]"),
    ("model.gen_layers", "0", r"config.model.gen_layers=0 must be in"),
    ("model.dd_cross_kv", "both", "config.model.dd_cross_kv='both' must be 'shared' or 'separate'"),
])
def test_bad_dd_options_name_the_field(field, value, match):
  c = nsl_config.load_config("configs/dd.py:dd_tiny", [(field, value)])
  with pytest.raises(ConfigError, match=match):
    nsl_config.validate(c)
