"""The trainer end to end on real text: records, accumulation, NaN skipping, exact resume."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.models.transformer import StandardFamily
from nsl.train import loop
from nsl.train import state as train_state
from nsl.train import step as train_step_lib
from tests.helpers import make_corpus, tiny_config


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return make_corpus(str(tmp_path_factory.mktemp("corpus")))


def _params(trainer):
  return jax.tree.map(np.asarray, jax.device_get(trainer.final_state.params))


def test_run_writes_the_record_format(data_dir, tmp_path, capsys):
  workdir = str(tmp_path / "run")
  result = loop.Trainer(tiny_config(data_dir, **{"train.steps": 12}), workdir, progress=False).run()
  assert result["status"] == "done" and result["steps"] == 12
  for name in ("metrics.jsonl", "config.json", "result.json"):
    assert os.path.exists(os.path.join(workdir, name)), name
  assert not os.path.exists(os.path.join(workdir, "loss_curve.png"))  # nsl.report draws it
  from nsl import report
  assert report.main([workdir]) == 0
  out = capsys.readouterr().out
  assert f"loss curve: {os.path.join(workdir, 'loss_curve.png')}" in out and "12 steps" in out
  assert os.path.getsize(os.path.join(workdir, "loss_curve.png")) > 10_000
  assert os.listdir(os.path.join(workdir, "tb"))
  records = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  train = [r for r in records if "loss" in r]
  assert [r["step"] for r in train] == list(range(1, 13))
  for key in ("step", "tokens", "loss", "lr", "grad_norm", "tokens_per_sec", "tflops_per_device"):
    assert key in train[-1], key
  assert train[-1]["loss"] < train[0]["loss"]
  assert any("eval_val_nll" in r for r in records)
  saved = json.load(open(os.path.join(workdir, "result.json")))
  assert saved["eval"]["val"] == pytest.approx(result["eval"]["val"])
  assert saved["tokens"] == 12 * 8 * 64 and saved["flops"] == pytest.approx(saved["flops_per_token"] * saved["tokens"])
  assert json.load(open(os.path.join(workdir, "config.json")))["train"]["steps"] == 12


def test_grad_accumulation_equals_one_big_batch(data_dir):
  config = tiny_config(data_dir)
  family = StandardFamily(config)
  opt = train_state.make_optimizer(config)
  import flax.linen as nn
  state = train_state.create(nn.unbox(family.init(jax.random.PRNGKey(0))), opt)
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 257, size=(8, 65)).astype(np.int32)
  segment = np.ones_like(tokens)
  segment[:, 40:] = 2  # two documents per row, and uneven target counts per micro-batch
  segment[::3, 50:] = 3
  batch = {"tokens": jnp.asarray(tokens), "segment": jnp.asarray(segment)}
  out = {}
  for accum in (1, 2, 4):
    step = jax.jit(train_step_lib.make_train_step(family, config, accum))
    new_state, m = step(state, batch, jax.random.PRNGKey(1), train_state.schedule_args(config))
    out[accum] = (new_state.params, float(m["loss"]))
  for accum in (2, 4):
    assert out[accum][1] == pytest.approx(out[1][1], rel=1e-6)
    for a, b in zip(jax.tree.leaves(out[accum][0]), jax.tree.leaves(out[1][0])):
      np.testing.assert_allclose(a, b, atol=1e-6)


def test_documents_in_a_packed_row_do_not_see_each_other(data_dir):
  config = tiny_config(data_dir)
  family = StandardFamily(config)
  params = family.init(jax.random.PRNGKey(0))
  import flax.linen as nn
  params = nn.unbox(params)
  rng = np.random.default_rng(1)
  tokens = rng.integers(1, 256, size=(1, 64)).astype(np.int32)
  segment = np.repeat([[1, 2, 3]], [20, 30, 14], axis=1).astype(np.int32)
  changed = tokens.copy()
  changed[0, :20] = rng.integers(1, 256, size=20)  # another first document
  changed[0, 50:] = rng.integers(1, 256, size=14)  # and another last one

  def per_token_nll(tok):
    logits = family.model.apply({"params": params}, jnp.asarray(tok[:, :-1]), jnp.asarray(segment[:, :-1]))
    logp = jax.nn.log_softmax(logits)
    return np.asarray(jnp.take_along_axis(logp, jnp.asarray(tok[:, 1:, None]), -1)[0, :, 0])

  a, b = per_token_nll(tokens), per_token_nll(changed)
  np.testing.assert_allclose(a[20:49], b[20:49], atol=1e-5)  # the middle document's targets
  assert np.abs(a[:19] - b[:19]).max() > 1e-3  # while the changed document's do change


def test_injected_nan_is_skipped_and_counted(data_dir, tmp_path, monkeypatch):
  original = StandardFamily.loss

  def poisoned(self, params, batch, rng, step):
    loss, m = original(self, params, batch, rng, step)
    return jnp.where(step == 2, jnp.nan, loss), m

  monkeypatch.setattr(StandardFamily, "loss", poisoned)
  trainer = loop.Trainer(tiny_config(data_dir), str(tmp_path / "run"), progress=False)
  result = trainer.run()
  assert result["status"] == "done" and result["nonfinite_steps"] == 1
  records = [json.loads(l) for l in open(tmp_path / "run" / "metrics.jsonl")]
  assert [r["nonfinite"] for r in records if "nonfinite" in r] == [0, 0, 1, 0, 0, 0]
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(_params(trainer)))


def test_too_many_nonfinite_steps_stop_the_run(data_dir, tmp_path, monkeypatch):
  monkeypatch.setattr(StandardFamily, "loss", lambda self, p, b, r, s: (jnp.float32(jnp.nan), {"weight": 1.0}))
  trainer = loop.Trainer(tiny_config(data_dir, **{"train.max_nonfinite": 2}), str(tmp_path / "run"), progress=False)
  with pytest.raises(loop.NslError, match="consecutive non-finite"):
    trainer.run()
  assert json.load(open(tmp_path / "run" / "result.json"))["status"] == "failed"


def test_preempted_run_resumes_to_identical_parameters(data_dir, tmp_path, monkeypatch):
  config = tiny_config(data_dir, **{"train.steps": 8, "checkpoint.every": 100})
  full = loop.Trainer(config, str(tmp_path / "full"), progress=False)
  full.run()
  monkeypatch.setattr(loop._Preemption, "poll", lambda self, step, save_due=False: (step == 5, save_due))
  first = loop.Trainer(config, str(tmp_path / "cut"), progress=False).run()
  assert first["status"] == "preempted" and first["steps"] == 5
  assert os.path.isdir(tmp_path / "cut" / "checkpoints" / "5")
  monkeypatch.undo()
  resumed = loop.Trainer(config, str(tmp_path / "cut"), progress=False)
  result = resumed.run()
  assert result["status"] == "done" and result["steps"] == 8
  for a, b in zip(jax.tree.leaves(_params(full)), jax.tree.leaves(_params(resumed))):
    np.testing.assert_array_equal(a, b)


def test_resume_refuses_a_changed_batch_size(data_dir, tmp_path, monkeypatch):
  config = tiny_config(data_dir, **{"train.steps": 4})
  monkeypatch.setattr(loop._Preemption, "poll", lambda self, step, save_due=False: (step == 2, save_due))
  loop.Trainer(config, str(tmp_path / "run"), progress=False).run()
  monkeypatch.undo()
  changed = tiny_config(data_dir, **{"train.steps": 4, "train.batch_size": 16})
  with pytest.raises(loop.ConfigError, match="train.batch_size=16 differs from the checkpoint"):
    loop.Trainer(changed, str(tmp_path / "run"), progress=False).run()


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_gradients(data_dir, remat):
  import flax.linen as nn
  batch = {"tokens": jnp.asarray(np.random.default_rng(0).integers(1, 257, size=(2, 65)), jnp.int32),
           "segment": jnp.ones((2, 65), jnp.int32)}
  grads = {}
  for mode in ("none", remat):
    family = StandardFamily(tiny_config(data_dir, **{"model.remat": mode}))
    params = nn.unbox(family.init(jax.random.PRNGKey(0)))
    grads[mode] = jax.jit(jax.grad(lambda p: family.loss(p, batch, None, 0)[0]))(params)  # one compile, not op by op
  for a, b in zip(jax.tree.leaves(grads["none"]), jax.tree.leaves(grads[remat])):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_checkpoint_every_minutes_saves_between_the_step_saves(data_dir, tmp_path):
  """A timed save (checkpoint.every_minutes, docs/guide/pods.md#preemption) lands between the
  `checkpoint.every` saves; off (0), only the final step is saved."""
  timed = tiny_config(data_dir, **{"train.steps": 4, "checkpoint.every": 100, "checkpoint.keep": 10,
                                   "checkpoint.every_minutes": 1e-9, "checkpoint.async_save": False})
  loop.Trainer(timed, str(tmp_path / "timed"), progress=False).run()
  assert sorted(int(p) for p in os.listdir(tmp_path / "timed" / "checkpoints") if p.isdigit()) == [1, 2, 3, 4]
  off = tiny_config(data_dir, **{"train.steps": 4, "checkpoint.every": 100, "checkpoint.keep": 10,
                                 "checkpoint.async_save": False})
  loop.Trainer(off, str(tmp_path / "off"), progress=False).run()
  assert sorted(int(p) for p in os.listdir(tmp_path / "off" / "checkpoints") if p.isdigit()) == [4]
