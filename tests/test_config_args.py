"""`--config=FILE:ARG` (issue #18): family files with an argument, the removed per-size paths
resolving to them with the same experiment (effective config and grid run id), one-line errors
for a bad argument, and `from configs import base` without sys.path changes."""

import json
import os
import sys
import textwrap

import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError
from nsl.scaling import grid
from tests.helpers import ROOT, run_cli

CONFIGS = os.path.join(ROOT, "configs")
SPS_VARIANTS = ("standard", "sps", "twox_memory", "delayed_state", "reverse_sps")
SPS_SIZES = ("tiny", "xs", "s", "m", "l", "xl")

# The removed files of the SPS family, verbatim in what they built (git show 46b5961:configs/...):
# the invariant is that each old file and its replacement build the same effective config.
OLD_SPS_TINY = '''
from configs import base

def variant_config(variant, family="sps"):
  c = base.get_config()
  c.family = family
  c.model.variant = variant
  c.model.d_model = 128
  c.model.n_layers = 4
  c.model.n_heads = 4
  c.model.d_ff = 384
  c.model.vocab_size = 4160
  c.model.window = None if variant in ("twox_memory", "standard") else 16
  if family == "sps":
    c.sps.layout = "stream_major"
  c.data.seq_len = 128
  c.train.batch_size = 16
  c.train.steps = 240
  c.train.warmup_steps = 20
  c.train.decay_steps = 60
  c.train.lr = 3e-3
  c.train.eval_every = 120
  c.checkpoint.every = 120
  return c

def get_config():
  return variant_config("sps")
'''


def _old_sps_file(variant: str, size: str) -> str:
  if size == "tiny":
    if variant == "sps":
      return OLD_SPS_TINY
    family = ', family="standard"' if variant == "standard" else ""
    return f"from configs import sps_tiny\ndef get_config():\n  return sps_tiny.variant_config({variant!r}{family})\n"
  if variant == "standard":
    return f"from configs import base\ndef get_config():\n  return base.paper_recipe(base.get_config(), {size!r})\n"
  window = None if variant == "twox_memory" else 64
  return textwrap.dedent(f"""\
      from configs import base
      def get_config():
        c = base.paper_recipe(base.get_config(), {size!r})
        c.family = "sps"
        c.model.variant = {variant!r}
        c.model.window = {window!r}
        c.sps.layout = "stream_major"
        return c
      """)


def _hash(config) -> str:
  return grid.config_hash(nsl_config.to_dict(config))


def test_every_old_sps_path_and_its_replacement_are_the_same_experiment(tmp_path):
  old_dir = tmp_path / "configs"  # a user's configs/ outside the repo: `configs.base` is nsl's
  old_dir.mkdir()
  (old_dir / "sps_tiny.py").write_text(OLD_SPS_TINY)
  for variant in SPS_VARIANTS:
    for size in SPS_SIZES:
      name = f"{variant}_{size}"
      old_file = old_dir / f"{name}.py"
      if name != "sps_tiny":
        old_file.write_text(_old_sps_file(variant, size))
      want = nsl_config.to_dict(nsl_config.load_config(str(old_file)))
      # Since the fold, every SPS paper config starts from the authors' init (configs/sps.py
      # authors_init, docs/xcheck/sps.md): the one intended difference from the old files.
      want["model"]["scaled_mlp_out_init"] = False
      spellings = [f"configs/sps.py:{name}", f"configs/{name}.py", os.path.join(CONFIGS, f"{name}.py")]
      if variant == "sps":
        spellings.append(f"configs/sps.py:{size}")
      for spelling in spellings:
        assert nsl_config.to_dict(nsl_config.load_config(spelling)) == want, (name, spelling)


def test_old_grid_spellings_give_the_same_cells_and_run_ids(tmp_path):
  old = tmp_path / "old_ladder.py"  # the grid as it read before the fold
  old.write_text('SIZES = ("xs", "s", "m", "l", "xl")\nVARIANTS = ("standard", "twox_memory", "delayed_state", "sps")\n'
                 'def get_grid():\n  return [{"axes": {"config": [f"configs/{v}_{s}.py" for s in SIZES for v in VARIANTS],'
                 ' "tokens": [20e9]}}, {"axes": {"config": [f"configs/standard_{s}.py" for s in SIZES], "tokens": [40e9]}}]\n')
  before = grid.expand(str(old), validate=False)
  after = grid.expand(os.path.join(CONFIGS, "grids", "sps_ladder.py"), validate=False)
  assert [c.run_id for c in before] == [c.run_id for c in after] and len(after) == 25
  assert after[0].run_id.startswith("standard_xs-20B-")
  assert after[0].config_path == "configs/sps.py:standard_xs"  # relative to the code a worker runs
  assert before[0].config_path == after[0].config_path  # a removed path launches its replacement
  assert after[0].launch_args("/w")[0] == "--config=configs/sps.py:standard_xs"


def test_moved_table_is_every_family_files_ARGS():
  table = nsl_config.folded(CONFIGS)  # configs/aliases.py, beside the configs
  assert set(table) == {"sps", "dd", "lift", "nextlat"}
  for family, names in table.items():
    spec = nsl_config.importlib.util.spec_from_file_location(f"t_{family}", os.path.join(CONFIGS, f"{family}.py"))
    module = nsl_config.importlib.util.module_from_spec(spec)
    with nsl_config.configs_package(spec.origin):
      spec.loader.exec_module(module)
    assert tuple(module.ARGS) == names, family
    for name in names:  # removed, so the table is what resolves it
      assert not os.path.exists(os.path.join(CONFIGS, f"{name}.py")), name
      assert nsl_config.resolve_config(f"configs/{name}.py") == (f"configs/{family}.py", name)


@pytest.mark.parametrize("spec,want", [
    ("configs/sps.py:xl", ("sps", "sps", 48)),
    ("configs/sps.py:twox_memory_m", ("sps", "twox_memory", 24)),
    ("configs/sps.py:standard_tiny", ("standard", "standard", 4)),
    ("configs/dd.py:6m", ("double_decoder", "random_uniform", 15)),
    ("configs/dd.py:decoder_only_100m", ("standard", "standard", 12)),
    ("configs/lift.py:s5_oracle", ("lift", "lift", 2)),
    ("configs/lift.py:standard_s5_8x", ("standard", "standard", 2)),
    ("configs/nextlat.py:mtp_path_star", ("mtp", "mtp", 12)),
])
def test_file_arg_selects_the_family_member(spec, want):
  c = nsl_config.load_config(spec)
  nsl_config.validate(c)
  assert (c.family, c.model.variant, c.model.n_layers) == want


@pytest.mark.parametrize("spec,match", [
    ("configs/sps.py:xxl", "has no argument 'xxl'; choose one of standard_tiny, standard_xs"),
    ("configs/sps.py", "takes an argument: --config=configs/sps.py:ARG with ARG one of standard_tiny"),
    ("configs/tiny.py:xl", "takes no argument; drop ':xl'"),
    ("configs/sps_xxl.py", "'configs/sps_xxl.py' does not exist"),
    ("configs/nope.py:xl", "'configs/nope.py' does not exist"),
])
def test_a_bad_argument_is_one_line_naming_the_valid_ones(spec, match):
  with pytest.raises(ConfigError, match=match) as e:
    nsl_config.load_config(spec)
  assert "\n" not in str(e.value)


def test_the_front_door_takes_old_and_new_spellings_alike():
  outs = [run_cli("-m", "nsl.launch", f"--config={spec}", "--mode=describe")
          for spec in ("configs/sps_tiny.py", "configs/sps.py:tiny")]
  assert all(o.returncode == 0 for o in outs), [o.stderr for o in outs]
  assert json.loads(outs[0].stdout) == json.loads(outs[1].stdout)
  bad = run_cli("-m", "nsl.launch", "--config=configs/sps.py:huge", "--mode=describe")
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "sps_xl" in bad.stderr


def test_loading_leaves_sys_path_and_the_callers_configs_modules_alone():
  import configs.base as callers_base  # the tests' own import of the repo's configs (conftest)
  path, modules = list(sys.path), {k: v for k, v in sys.modules.items() if k.split(".")[0] == "configs"}
  nsl_config.load_config("configs/dd.py:tiny")
  assert sys.path == path
  assert {k: v for k, v in sys.modules.items() if k.split(".")[0] == "configs"} == modules
  assert sys.modules["configs.base"] is callers_base


def test_user_config_dirs_get_their_own_siblings_then_nsls(tmp_path):
  mine = tmp_path / "exp" / "configs"  # a user's own configs/ with its own base.py
  mine.mkdir(parents=True)
  (mine / "base.py").write_text("from nsl import config as _c\nimport importlib.util as _u\n"
                                f"_s = _u.spec_from_file_location('nsl_base', {os.path.join(CONFIGS, 'base.py')!r})\n"
                                "_m = _u.module_from_spec(_s); _s.loader.exec_module(_m)\n"
                                "def get_config():\n  c = _m.get_config(); c.seed = 7; return c\n")
  (mine / "mine.py").write_text("from configs import base, tiny\n"  # tiny.py is only nsl's
                                "def get_config():\n  c = base.get_config(); c.model.d_model = tiny.get_config().model.d_model\n"
                                "  return c\n")
  c = nsl_config.load_config(str(mine / "mine.py"))
  assert c.seed == 7 and c.model.d_model == 192
  loose = tmp_path / "elsewhere.py"  # outside any configs/: `configs` is nsl's
  loose.write_text("from configs import base\ndef get_config():\n  return base.get_config()\n")
  assert nsl_config.load_config(str(loose)).seed == 0
  assert nsl_config.load_config(str(mine / "mine.py")).seed == 7  # nothing cached across loads


def test_grid_resolves_file_arg_relative_to_the_grid(tmp_path):
  assert grid.resolve_config_path("configs/sps.py:xs") == os.path.join(CONFIGS, "sps.py") + ":xs"
  assert grid.resolve_config_path("configs/sps_xs.py") == os.path.join(CONFIGS, "sps.py") + ":sps_xs"
  with pytest.raises(ConfigError, match="does not exist"):
    grid.resolve_config_path("configs/nope.py:xs", str(tmp_path / "g.py"))
