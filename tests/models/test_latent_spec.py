"""NextLat / MTP options in one home (`nsl.models.latent_spec`): schemas mounted at `config.nextlat`
and `config.mtp` (nsl.schema), defaults declared beside the options, every bad value one ConfigError."""

import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError
from nsl.models import registry
from nsl.models.latent_spec import NextLatSpec, answer_token, mtp_section, nextlat_section
from nsl.models.nextlat import MTPFamily, NextLatFamily


def test_configs_sections_are_the_specs_defaults_with_their_changes():
  c = nsl_config.load_config("configs/nextlat.py:tiny")
  assert NextLatFamily.options_of(c) == NextLatSpec(hidden=2 * c.model.d_model)  # d = 192
  assert dict(c.nextlat) == dict(nextlat_section(hidden=384))
  path_star = NextLatFamily.options_of(nsl_config.load_config("configs/nextlat.py:path_star"))
  # The authors' path-star model: d = ℓ - 2 = 3 on G_{5,5}, hidden 384 at 384d, final-normed h.
  assert (path_star.lambda_h, path_star.horizon, path_star.hidden, path_star.draft_len) == (1.0, 3, 384, 4)
  assert path_star.latent == "final_norm" and path_star.emb_grad is True  # issue #45
  assert MTPFamily.options_of(nsl_config.load_config("configs/nextlat.py:mtp_tiny")).horizon == 4
  assert answer_token(c) == -1
  assert answer_token(nsl_config.load_config("configs/nextlat.py:gpt_path_star")) == 102


def test_the_family_reads_the_spec():
  c = nsl_config.load_config("configs/nextlat.py:tiny", [("nextlat.horizon", "3")])
  family = registry.get_family(c)
  assert family.horizon == 3 and family.spec.emb_grad is True and family.spec.draft_len == 4
  assert dict(mtp_section()) == {"horizon": 2}
  del c.nextlat["emb_grad"]  # a hand-edited section: the base config holds every option
  with pytest.raises(ConfigError, match="config.nextlat.emb_grad is missing; start the config from configs/base.py"):
    registry.get_family(c)


@pytest.mark.parametrize("spec,field,value,match", [
    ("tiny", "nextlat.horizon", "0", "config.nextlat.horizon=0 must be >= 1"),
    ("tiny", "nextlat.draft_len", "0", "config.nextlat.draft_len=0 must be >= 1"),
    ("tiny", "nextlat.lambda_kl", "-1.0", "config.nextlat.lambda_kl=-1.0 must be >= 0"),
    ("mtp_tiny", "mtp.horizon", "0", "config.mtp.horizon=0 must be >= 1"),
])
def test_bad_options_name_the_field(spec, field, value, match):
  c = nsl_config.load_config(f"configs/nextlat.py:{spec}", [(field, value)])
  with pytest.raises(ConfigError, match=match):
    nsl_config.validate(c)


def test_unknown_missing_and_mistyped_sections_are_one_line_errors():
  c = nsl_config.load_config("configs/nextlat.py:tiny")
  c.nextlat.horizn = 3
  with pytest.raises(ConfigError, match=r"config.nextlat.horizn is not an option \(did you mean 'nextlat.horizon'\?\)"):
    nsl_config.validate(c)
  del c.nextlat["horizn"]
  c.nextlat.hidden = None
  with pytest.raises(ConfigError, match="config.nextlat.hidden=None must be an integer"):
    nsl_config.validate(c)
  del c["nextlat"]
  with pytest.raises(ConfigError, match="config.nextlat is missing; start the config from configs/base.py"):
    nsl_config.validate(c)
