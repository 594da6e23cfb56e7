"""Option schemas (nsl/schema.py, docs/reference/config.md): the base config is every schema's
fields, each overridable from the command line; a stray field is refused with "did you mean";
a config or a run saved in the layout before the families' mounts reads (and keys its grid
cell) the same; no module of nsl/ restates a default with `.get(name, default)`."""

import pathlib
import re

import ml_collections
import pytest

from nsl import config as nsl_config
from nsl import options, schema
from nsl.errors import ConfigError
from nsl.models import registry
from nsl.scaling import cells

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _leaves(d, prefix=""):
  for k, v in d.items():
    if isinstance(v, dict) and k != "evals":
      yield from _leaves(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def test_the_base_is_the_schemas_and_every_field_overrides_from_the_command_line():
  c = nsl_config.load_config("configs/base.py")
  mounted = {f"{p}.{n}".lstrip(".") for p, ss in options.mounts().items() for s in ss for n in schema.field_names(s)}
  leaves = dict(_leaves(nsl_config.to_dict(c)))
  assert set(leaves) == mounted
  overrides = {"model.mlp": "gelu", "model.document_mask": "false", "sed.noise_density": "0.3",
               "double_decoder.gen_layers": "2", "sps.predict_token_id": "4095", "nextlat.horizon": "3",
               "lift.top_k": "7", "data.answer_token": "5", "train.clip_norm": "None", "init_seed": "4"}
  c = nsl_config.load_config("configs/base.py", list(overrides.items()))
  assert (c.model.mlp, c.model.document_mask, c.sed.noise_density, c.double_decoder.gen_layers) == ("gelu", False, 0.3, 2)
  assert (c.sps.predict_token_id, c.nextlat.horizon, c.lift.top_k, c.data.answer_token) == (4095, 3, 7, 5)
  assert c.train.clip_norm is None and c.init_seed == 4
  nsl_config.validate(c)


@pytest.mark.parametrize("key,match", [
    ("model.windw", r"unknown config key 'model.windw' \(did you mean 'model.window'\?\)"),
    ("sed.noise_densty", r"did you mean 'sed.noise_density'"),
    ("model.noise_density", r"moved: config.sed.noise_density"),
    ("model.nextlat.horizon", r"moved: config.nextlat.horizon"),
])
def test_an_unknown_override_is_one_line_with_did_you_mean_or_where_it_moved(key, match):
  with pytest.raises(ConfigError, match=match):
    nsl_config.load_config("configs/base.py", [(key, "1")])


def test_a_stray_field_a_config_file_adds_is_refused_by_validate():
  c = nsl_config.load_config("configs/base.py")
  c.model.windw = 3
  with pytest.raises(ConfigError, match=r"config.model.windw is not an option \(did you mean 'model.window'\?\)"):
    nsl_config.validate(c)
  c = nsl_config.load_config("configs/base.py")
  c.lift.topk = 3
  with pytest.raises(ConfigError, match=r"config.lift.topk is not an option \(did you mean 'lift.top_k'\?\)"):
    nsl_config.validate(c)


def test_a_value_of_the_wrong_type_is_named():
  c = nsl_config.load_config("configs/dd.py:sed_tiny")
  c.sed = ml_collections.ConfigDict({**c.sed.to_dict(), "sentinels": "many"})  # as a config.json may hold it
  with pytest.raises(ConfigError, match=r"config.sed.sentinels='many' must be an integer"):
    registry.get_family_class("sed").options_of(c)
  c = nsl_config.load_config("configs/base.py")
  c.model.d_model = None
  with pytest.raises(ConfigError, match=r"config.model.d_model=None must be an integer"):
    registry.get_family(c)


def _old_layout(config_dict: dict, family_section: str, legacy: dict) -> dict:
  """`config_dict` as nsl wrote it before the families' mounts: no family sections, the family's
  options at their `legacy` places."""
  old = {k: v for k, v in config_dict.items() if k not in ("sps", "double_decoder", "sed", "nextlat", "mtp", "lift")}
  old["model"] = dict(old["model"])
  for path, field in legacy.items():
    where, leaf = path.split(".")
    value = config_dict[family_section] if field == "*" else config_dict[family_section][field]
    old[where] = {**old[where], leaf: value}
  return old


@pytest.mark.parametrize("spec", ["configs/dd.py:dd_tiny", "configs/dd.py:sed_tiny", "configs/nextlat.py:nextlat_tiny",
                                  "configs/nextlat.py:mtp_tiny", "configs/sps.py:sps_tiny"])
def test_a_config_in_the_old_layout_reads_and_keys_the_same(spec):
  now = nsl_config.to_dict(nsl_config.load_config(spec))
  cls = registry.get_family_class(now["family"])
  old = _old_layout(now, cls.name, {p: f for p, f in cls.legacy.items() if f not in cls.legacy_if_set})
  up = options.upgraded(old)
  assert up[cls.name] == now[cls.name]
  assert nsl_config.resume_differences(old, now) == []
  assert cells.config_hash(old) == cells.config_hash(now)  # a grid run before keeps its cells' ids
  changed = dict(now, **{cls.name: {**now[cls.name], next(iter(now[cls.name])): "changed"}})
  assert cells.config_hash(changed) != cells.config_hash(now)


def test_other_families_options_are_not_part_of_a_run():
  now = nsl_config.to_dict(nsl_config.load_config("configs/dd.py:dd_tiny"))
  other = dict(now, sed={**now["sed"], "noise_density": 0.5})
  assert cells.config_hash(other) == cells.config_hash(now)
  assert nsl_config.resume_differences(now, other) == []


def test_no_module_restates_a_default_with_get():
  """`.get(name, default)` on a config (a ConfigDict that the schemas fill) is how defaults
  drifted apart; nsl.options completes an older config, so it asks what is there. Reading a
  record (result.json, cell.json, slurm.conf) with .get is fine."""
  pattern = re.compile(r"\b(config|cfg|model|data|train|log|m|d|t|l)(\.\w+)*\.get\(\"")
  allowed = {"nsl/options.py", "nsl/scaling/records.py", "nsl/scaling/study.py", "nsl/scaling/cells.py",
             "nsl/scaling/slurm.py", "nsl/data/prepare.py"}
  hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in sorted((ROOT / "nsl").rglob("*.py"))
          if str(p.relative_to(ROOT)) not in allowed
          for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
  assert hits == []


def test_the_config_reference_lists_every_field_and_nothing_else():
  """docs/reference/config.md's tables name each schema's fields (`section.field`, several to a
  row), so the page cannot drift from the schemas it documents."""
  text = (ROOT / "docs" / "reference" / "config.md").read_text()
  rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
  documented = {name for cell in rows for name in re.findall(r"`([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)?)`", cell)}
  mounted = {f"{p}.{n}".lstrip(".") for p, ss in options.mounts().items() for s in ss for n in schema.field_names(s)}
  assert sorted(mounted - documented) == [] and sorted(documented - mounted) == []
