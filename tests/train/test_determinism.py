"""Two fresh runs of the same config are the same bits (docs/guide/determinism.md): parameters,
optimizer state, every logged metric, the evaluation and the result's state digest, with the
default CPU kernels in the step (issue #42: the head kernel's gradient depended on which thread
ran which vocabulary chunk, so two runs drifted apart in the last bits within a few steps)."""

import jax
import numpy as np
import pytest

from nsl import checkpoint
from nsl.train import loop
from tests.helpers import make_corpus
from tests.train import bitwise


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return make_corpus(str(tmp_path_factory.mktemp("corpus")), n=4, chars=3000)


CONFIG = {"train.steps": 6, "train.eval_every": 3}


@pytest.fixture(scope="module")
def first_run(data_dir, tmp_path_factory):
  """A fresh 6-step run on the default kernels (checked): (workdir, final state)."""
  workdir = tmp_path_factory.mktemp("runs") / "a"
  trainer = loop.Trainer(bitwise.kernel_config(data_dir, **CONFIG), str(workdir), progress=False,
                         devices=bitwise.one_device())
  bitwise.assert_default_kernels(trainer.program)
  trainer.run()
  return workdir, trainer.final_state


def _assert_same_state(a, b):
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
    assert np.array_equal(np.asarray(x), np.asarray(y)), f"{jax.tree_util.keystr(path)} differs"


def test_two_fresh_runs_are_the_same_bits(data_dir, first_run, tmp_path):
  trainer = loop.Trainer(bitwise.kernel_config(data_dir, **CONFIG), str(tmp_path / "b"), progress=False,
                         devices=bitwise.one_device())
  trainer.run()
  workdir, state = first_run
  _assert_same_state(state, trainer.final_state)
  assert bitwise.metrics(workdir) == bitwise.metrics(tmp_path / "b")
  ra, rb = bitwise.result(workdir), bitwise.result(tmp_path / "b")
  assert ra == rb and ra["state_sha256"] == checkpoint.state_digest(state)


def test_when_to_log_evaluate_and_checkpoint_leaves_the_bits_alone(data_dir, first_run, tmp_path):
  """The fields docs/guide/determinism.md lists as keeping the bits: other logging, evaluation
  and checkpoint steps (and an asynchronous save) give the same state and the same logged losses."""
  changed = {**CONFIG, "train.log_every": 2, "train.eval_every": 2, "train.eval_batches": 1,
             "checkpoint.every": 4, "checkpoint.async_save": True}
  trainer = loop.Trainer(bitwise.kernel_config(data_dir, **changed), str(tmp_path / "c"), progress=False,
                         devices=bitwise.one_device())
  trainer.run()
  workdir, state = first_run
  _assert_same_state(state, trainer.final_state)
  train_lines = lambda d: {r["step"]: r for r in bitwise.metrics(d) if "loss" in r}
  every, second = train_lines(workdir), train_lines(tmp_path / "c")
  assert sorted(second) == [2, 4, 6] and all(second[s]["loss"] == every[s]["loss"] for s in second)
  assert bitwise.result(tmp_path / "c")["state_sha256"] == bitwise.result(workdir)["state_sha256"]


def _flip_last_bit(x):
  y = np.array(x)
  y.reshape(-1).view(np.uint32)[0] ^= 1
  return y


def test_the_digest_covers_every_bit_of_the_state():
  """One flipped bit of a parameter or of an optimizer moment, or another step, changes the
  digest; the same values in new arrays do not."""
  import optax

  from nsl.train import state as train_state
  params = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.full(3, 0.5, np.float32)}
  st = train_state.create(params, optax.adam(1e-3))
  base = checkpoint.state_digest(st)
  assert base.startswith("sha256:") and base == checkpoint.state_digest(jax.tree.map(np.array, st))
  mu = st.opt_state[0].mu
  variants = [st.replace(step=st.step + 1),
              st.replace(params={**params, "b": _flip_last_bit(params["b"])}),
              st.replace(opt_state=(st.opt_state[0]._replace(mu={**mu, "w": _flip_last_bit(mu["w"])}),
                                    *st.opt_state[1:]))]
  assert len({base, *map(checkpoint.state_digest, variants)}) == 4
