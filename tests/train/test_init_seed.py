"""config.init_seed: the parameters' seed beside config.seed (data order and the rest)."""

import json
import os

import jax
import numpy as np
import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError
from nsl.scaling import grid
from nsl.train import loop
from tests.helpers import make_corpus, run_cli, tiny_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return make_corpus(str(tmp_path_factory.mktemp("corpus")))


def _train(data_dir, workdir, **overrides):
  trainer = loop.Trainer(tiny_config(data_dir, **{"train.steps": 4, "checkpoint.every": 100, **overrides}),
                         str(workdir), progress=False)
  result = trainer.run()
  params = jax.tree.map(np.asarray, jax.device_get(trainer.final_state.params))
  losses = [json.loads(l)["loss"] for l in open(os.path.join(workdir, "metrics.jsonl")) if '"loss"' in l]
  return result, params, losses


@pytest.fixture(scope="module")
def seed_3(data_dir, tmp_path_factory):
  """The run at seed 3 with init_seed unset, trained once for both tests that need one: the
  reference of the unset-keeps-the-bits test and the other-init_seed test's same-seed baseline."""
  return _train(data_dir, tmp_path_factory.mktemp("seed_3"), seed=3)


def _same_bits(a, b) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_unset_init_seed_keeps_the_bits_of_seed(data_dir, seed_3, tmp_path):
  """None (the default) and a config from before the field (key absent) train exactly as
  init_seed = seed: existing runs keep their bits."""
  r_none, p_none, l_none = seed_3
  r_same, p_same, l_same = _train(data_dir, tmp_path / "same", seed=3, init_seed=3)
  old = tiny_config(data_dir, **{"train.steps": 4, "checkpoint.every": 100, "seed": 3})
  del old["init_seed"]
  trainer = loop.Trainer(old, str(tmp_path / "old"), progress=False)
  trainer.run()
  p_old = jax.tree.map(np.asarray, jax.device_get(trainer.final_state.params))
  assert _same_bits(p_none, p_same) and _same_bits(p_none, p_old) and l_none == l_same
  assert r_none["seed"] == 3 and r_none["init_seed"] == 3


def test_init_seed_changes_only_the_initialisation(data_dir, seed_3, tmp_path):
  """Another init_seed: other step-0 parameters, the same batches (data order from seed)."""
  config = tiny_config(data_dir)
  from nsl.train import program
  prog = program.Program(config, jax.devices()[:1])
  with prog.mesh_context():
    init = lambda s: jax.tree.leaves(jax.device_get(prog.init(jax.random.PRNGKey(s)).params))
  a, b = seed_3, _train(data_dir, tmp_path / "b", seed=3, init_seed=5)
  assert b[0]["init_seed"] == 5 and b[0]["seed"] == 3
  assert not _same_bits(a[1], b[1])
  # the batches are the same: the first step's loss differs only by the (small) init difference
  assert abs(a[2][0] - b[2][0]) < 0.05
  assert not all(np.array_equal(x, y) for x, y in zip(init(0), init(5)))
  it = lambda seed: next(__import__("nsl.data.pipeline", fromlist=["x"]).make_train_iterator(
      data_dir, seq_len=64, global_batch_size=8, seed=seed))["tokens"]
  assert np.array_equal(it(0), it(0)) and not np.array_equal(it(0), it(5))


@pytest.mark.parametrize("value", [-1, True])
def test_bad_init_seed_is_named(value):
  config = tiny_config("data/x")
  config.init_seed = value  # the int placeholder takes both; validation refuses them
  with pytest.raises(ConfigError, match=r"config\.init_seed=.* must be a non-negative integer, or None"):
    nsl_config.validate(config)


@pytest.mark.parametrize("raw", ["1.5", "abc"])
def test_init_seed_of_another_type_is_named(raw):
  with pytest.raises(ConfigError, match=r"config\.init_seed"):
    nsl_config.load_config("configs/tiny.py", [("init_seed", raw)])


def test_init_seed_from_the_command_line(tmp_path):
  config = nsl_config.load_config("configs/tiny.py", [("init_seed", "3")])
  assert config.init_seed == 3 and nsl_config.init_seed(config) == 3 and config.seed == 0
  assert nsl_config.init_seed(nsl_config.load_config("configs/tiny.py")) == 0
  out = run_cli("-m", "nsl.launch", "--config=configs/tiny.py", f"--workdir={tmp_path / 'w'}",
                "--config.init_seed=-2", "--quiet")
  assert out.returncode == 2 and "config.init_seed=-2" in out.stderr


def test_unset_init_seed_keeps_grid_ids():
  """Grid cells from before the field keep their run ids; a set init_seed is a new experiment."""
  d = nsl_config.to_dict(nsl_config.load_config("configs/tiny.py"))
  assert d["init_seed"] is None
  before = {k: v for k, v in d.items() if k != "init_seed"}
  assert grid.config_hash(d) == grid.config_hash(before)
  assert grid.config_hash({**d, "init_seed": 1}) != grid.config_hash(before)
