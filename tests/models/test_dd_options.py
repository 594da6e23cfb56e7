"""The options of the double-decoder paper's families, each a schema mounted at `config.<family>`
(nsl.schema): SED's `nsl.models.sed.SEDSpec` at `config.sed`, the double decoder's
`nsl.models.double_decoder.DDSpec` at `config.double_decoder`; every bad value one ConfigError."""

import pytest

from nsl import config as nsl_config
from nsl import options
from nsl.errors import ConfigError
from nsl.models import registry
from nsl.models.double_decoder import DDSpec, DoubleDecoderFamily
from nsl.models.sed import SEDFamily, SEDSpec


def test_sed_reads_its_section_and_the_base_holds_the_defaults():
  c = nsl_config.load_config("configs/dd.py:sed_tiny")
  assert SEDFamily.options_of(c) == SEDSpec(noise_density=0.15, mean_span=4.0, sentinels=100, gen_layers=1)
  base = nsl_config.load_config("configs/base.py")
  c.sed = base.sed  # the schema's defaults: T5's 0.15 / 4 / 100, decoder n_layers // 3
  assert SEDFamily.options_of(c) == SEDSpec()
  family = registry.get_family(c)
  assert family.split() == (2, 1) and family.sentinels == 100 and family.corruption == (0.15, 4.0)


@pytest.mark.parametrize("field,value,match", [
    ("sed.noise_density", "1.0", "config.sed.noise_density=1.0 must be in"),
    ("sed.mean_span", "0.0", "config.sed.mean_span=0.0 must be positive"),
    ("sed.gen_layers", "3", r"config.sed.gen_layers=3 \(decoder layers\) must be in \[1"),
    ("sed.sentinels", "200", "config.model.vocab_size=4224 leaves no room for the 200 sentinels"),
    ("sed.sentinels", "2", "gives 5 noise spans, more than sed.sentinels=2"),
])
def test_bad_sed_options_name_the_field(field, value, match):
  c = nsl_config.load_config("configs/dd.py:sed_tiny", [(field, value)])
  with pytest.raises(ConfigError, match=match):
    nsl_config.validate(c)


def test_dd_reads_its_section_and_the_base_holds_the_defaults():
  c = nsl_config.load_config("configs/dd.py:dd_tiny")
  assert DoubleDecoderFamily.options_of(c) == DDSpec(gen_layers=1, cross_kv="shared")
  c.double_decoder = nsl_config.load_config("configs/base.py").double_decoder
  assert DoubleDecoderFamily.options_of(c) == DDSpec()
  family = registry.get_family(c)
  assert not family.separate_cross_kv and family.make_model().gen_layers == 3 // 3


@pytest.mark.parametrize("field,value,match", [
    ("double_decoder.gen_layers", "3", r"config.double_decoder.gen_layers=3 must be in \[1, model.n_layers-1=2\]"),
    ("double_decoder.gen_layers", "0", r"config.double_decoder.gen_layers=0 must be in"),
    ("double_decoder.cross_kv", "both", "config.double_decoder.cross_kv='both' must be 'shared' or 'separate'"),
])
def test_bad_dd_options_name_the_field(field, value, match):
  c = nsl_config.load_config("configs/dd.py:dd_tiny", [(field, value)])
  with pytest.raises(ConfigError, match=match):
    nsl_config.validate(c)


def test_a_run_saved_with_the_options_in_config_model_reads_the_same():
  """A checkpoint's config.json from before the mounts: its loose `model.*` options move to the
  family's section (`Family.legacy`), None meaning the default where the option takes none."""
  now = nsl_config.to_dict(nsl_config.load_config("configs/dd.py:sed_tiny", [("sed.noise_density", "0.3")]))
  old = {k: v for k, v in now.items() if k not in ("sed", "double_decoder", "sps", "nextlat", "mtp", "lift")}
  old["model"] = {**now["model"], "noise_density": 0.3, "mean_span": 4.0, "sentinels": 100, "gen_layers": 1,
                  "sed_cross_rope": None}
  up = options.upgraded(old)
  assert up["sed"] == now["sed"] and "noise_density" not in up["model"]
  assert nsl_config.resume_differences(old, now) == []
