"""Weighted mixtures: shares follow the weights, resume is exact, bad weights are one line."""

import os
import subprocess
import sys

import numpy as np
import pytest

from nsl.data import mixture
from nsl.data import prepare as prepare_lib
from nsl.errors import ConfigError

SEQ = 31
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, corpus, make_corpus):
  """Two byte dirs of different text (the corpus, and another corpus) and their mixture spec."""
  root = tmp_path_factory.mktemp("mix")
  other = root / "other_corpus"
  make_corpus(str(other), num_docs=40, seed=9)
  a, b = str(root / "a"), str(root / "b")
  prepare_lib.prepare(a, [corpus[0]], "byte", val_fraction=0.2, shard_tokens=700)
  prepare_lib.prepare(b, [str(other / "*.txt")], "byte", val_fraction=0.2, shard_tokens=700)
  return a, b


def windows_of(d):
  m = prepare_lib.load_manifest(d)
  flat = np.concatenate([np.fromfile(os.path.join(d, s["file"]), "<u2") for s in m["splits"]["train"]["shards"]])
  n = flat.size // (SEQ + 1)
  return {w.tobytes() for w in flat[: n * (SEQ + 1)].reshape(n, SEQ + 1).astype(np.int32)}


def test_shares_follow_the_weights(dirs):
  a, b = dirs
  spec = f"{a}=3,{b}=1"
  it = mixture.make_train_iterator(spec, SEQ, 8, seed=0)
  wa, wb = windows_of(a), windows_of(b)
  rows_a = rows_b = 0
  for _ in range(50):
    toks = next(it)["tokens"]
    assert toks.shape == (8, SEQ + 1)
    in_a = sum(r.tobytes() in wa for r in toks)
    in_b = sum(r.tobytes() in wb for r in toks)
    assert in_a + in_b == 8
    rows_a, rows_b = rows_a + in_a, rows_b + in_b
  assert abs(rows_a / 400 - 0.75) < 0.02  # Grain's mix keeps exact running proportions
  shares = it.take_shares()
  assert shares == {"data_share/a": rows_a / 400, "data_share/b": rows_b / 400}
  assert it.take_shares() == {}


def test_resume_gives_the_uninterrupted_sequence(dirs):
  a, b = dirs
  spec = f"{a}=0.5,{b}=0.5"
  ref = mixture.make_train_iterator(spec, SEQ, 4, seed=3)
  want = [next(ref)["tokens"] for _ in range(30)]
  it = mixture.make_train_iterator(spec, SEQ, 4, seed=3, read_threads=0, prefetch=0)
  for _ in range(17):
    next(it)
  state = it.get_state()
  resumed = mixture.make_train_iterator(spec, SEQ, 4, seed=3)
  resumed.set_state(repr(state).replace("'", '"').encode())  # as Grain's handler passes it: JSON bytes
  for step in range(17, 30):
    np.testing.assert_array_equal(next(resumed)["tokens"], want[step])
  halves = [mixture.make_train_iterator(spec, SEQ, 4, seed=3, process_index=p, process_count=2) for p in range(2)]
  for step in range(5):
    np.testing.assert_array_equal(np.concatenate([next(h)["tokens"] for h in halves]), want[step])


@pytest.mark.parametrize("spec,match", [
    ("data/a=-1,data/b=2", "weight -1 of 'data/a' must be a finite number >= 0"),
    ("data/a=0,data/b=0", "the weights sum to 0"),
    ("data/a", "is not DIR=WEIGHT"),
    ("data/a=x", "is not a number"),
    ("x/a=1,y/a=1", "two sources are named 'a'"),
])
def test_bad_mixtures_are_config_errors(spec, match):
  with pytest.raises(ConfigError, match=match):
    mixture.parse(spec)


def test_launch_refuses_a_negative_weight_before_writing(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "nsl.launch", "--config=configs/tiny.py", f"--workdir={tmp_path}/run",
                         "--config.data.mixture=data/a=-1,data/b=1"], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().count("\n") == 0 and "must be a finite number >= 0" in proc.stderr
  assert not os.path.exists(tmp_path / "run")


def test_checkpoint_restores_the_mixture_position(dirs, tmp_path):
  """Through the trainer's Checkpointer (Grain's handler hands a non-Grain iterator JSON bytes)."""
  import jax
  import jax.numpy as jnp

  from nsl import checkpoint

  a, b = dirs
  spec = f"{a}=2,{b}=1"
  ref = mixture.make_train_iterator(spec, SEQ, 4, seed=1)
  want = [next(ref)["tokens"] for _ in range(12)]
  it = mixture.make_train_iterator(spec, SEQ, 4, seed=1)
  for _ in range(7):
    next(it)
  ckpt = checkpoint.Checkpointer(str(tmp_path / "ckpt"), keep=1, async_save=False)
  state = {"w": jnp.zeros(3)}
  ckpt.save(7, state, it, {})
  resumed = mixture.make_train_iterator(spec, SEQ, 4, seed=1)
  ckpt.restore(7, jax.eval_shape(lambda: state), resumed)
  for step in range(7, 12):
    np.testing.assert_array_equal(next(resumed)["tokens"], want[step])
