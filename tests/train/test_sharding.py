"""Meshes over 8 fake CPU devices give the 1-device loss curve, with parameters sharded as declared."""

import json

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from nsl import sharding
from nsl.errors import ConfigError
from nsl.train import loop
from tests.helpers import make_corpus, tiny_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return make_corpus(str(tmp_path_factory.mktemp("corpus")))


def _config(data_dir, shape):
  # vocab 264 and d_ff 128 divide over tensor=2; d 32 over fsdp=4
  return tiny_config(data_dir, **{"model.vocab_size": 264, "model.d_ff": 128, "train.steps": 5,
                                  "train.eval_every": 100, "checkpoint.every": 100, "mesh.shape": shape})


def _losses(workdir):
  return [r["loss"] for r in map(json.loads, open(f"{workdir}/metrics.jsonl")) if "loss" in r]


def test_meshes_match_one_device(data_dir, tmp_path):
  assert jax.device_count() == 8, "tests/conftest.py sets 8 fake CPU devices"
  single = loop.Trainer(_config(data_dir, (1, 1, 1)), str(tmp_path / "one"), progress=False,
                        devices=jax.devices()[:1])
  single.run()
  reference = _losses(tmp_path / "one")
  for shape in [(8, 1, 1), (2, 2, 2), (1, 4, 2)]:
    workdir = tmp_path / "x".join(map(str, shape))
    trainer = loop.Trainer(_config(data_dir, shape), str(workdir), progress=False)
    trainer.run()
    np.testing.assert_allclose(_losses(workdir), reference, rtol=1e-4)
    params = trainer.final_state.params
    data, fsdp, tensor = shape
    wq = params["trunk"]["block_0"]["attn"]["wq"]  # [d, heads, head_dim]: embed->fsdp, heads->tensor
    assert wq.sharding.spec == P("fsdp", "tensor", None)
    assert wq.addressable_shards[0].data.shape == (32 // fsdp, 2 // tensor, 16)
    emb = params["embed"]["embedding"]  # [vocab, d]: vocab->tensor, embed->fsdp
    assert emb.addressable_shards[0].data.shape == (264 // tensor, 32 // fsdp)
    mu = trainer.final_state.opt_state[1][0].mu["trunk"]["block_0"]["mlp"]["w_up"]  # Adam moments follow
    assert mu.addressable_shards[0].data.shape == (32 // fsdp, 128 // tensor)


def test_mesh_that_does_not_fit_is_a_config_error(data_dir):
  config = _config(data_dir, (3, -1, 1))
  with pytest.raises(ConfigError, match="does not fit 8 devices"):
    sharding.mesh_shape(config, 8)
  with pytest.raises(ConfigError, match="needs 4 devices but 8"):
    sharding.mesh_shape(_config(data_dir, (2, 2, 1)), 8)


def test_indivisible_parameter_is_a_config_error(data_dir, tmp_path):
  config = _config(data_dir, (1, 1, 8))  # 2 heads over tensor=8
  with pytest.raises(ConfigError, match="not divisible by mesh axes"):
    loop.Trainer(config, str(tmp_path / "run"), progress=False)


def test_resume_on_a_different_mesh_reshards_the_state(data_dir, tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  monkeypatch.setattr(loop._Preemption, "poll", lambda self, step, save_due=False: (step == 3, save_due))
  first = loop.Trainer(_config(data_dir, (8, 1, 1)), workdir, progress=False).run()
  assert first["status"] == "preempted"
  monkeypatch.undo()
  trainer = loop.Trainer(_config(data_dir, (2, 2, 2)), workdir, progress=False)
  assert trainer.run()["status"] == "done"
  wq = trainer.final_state.params["trunk"]["block_0"]["attn"]["wq"]
  assert wq.sharding.spec == P("fsdp", "tensor", None) and wq.sharding.mesh.shape["tensor"] == 2
  reference = loop.Trainer(_config(data_dir, (8, 1, 1)), str(tmp_path / "ref"), progress=False)
  reference.run()
  np.testing.assert_allclose(_losses(workdir), _losses(tmp_path / "ref"), rtol=1e-4)
