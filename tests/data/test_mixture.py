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


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, corpus, make_corpus):
  """A 3-step mixture run on two BPE dirs of different text (one tokenizer: b reuses a's), weights 3:1."""
  from tests.helpers import SHORT_RUN, tiny_config
  from nsl.train import loop

  root = tmp_path_factory.mktemp("mixrun")
  make_corpus(str(root / "other_corpus"), num_docs=40, seed=9)
  a, b = str(root / "a"), str(root / "b")
  prepare_lib.prepare(a, [corpus[0]], "bpe", vocab_size=300, val_fraction=0.2)
  prepare_lib.prepare(b, [str(root / "other_corpus" / "*.txt")], val_fraction=0.2, tokenizer_from=a)
  config = tiny_config(a, **SHORT_RUN, **{"data.mixture": f"{a}=3,{b}=1", "model.vocab_size": 320})
  workdir = str(root / "run")
  return a, b, workdir, config, loop.Trainer(config, workdir, progress=False).run()


def test_mixture_runs_record_each_sources_bits_per_byte_and_the_mixtures(bpe_run):
  import json
  import math

  from nsl.data import bytes_per_token

  a, b, workdir, config, result = bpe_run
  assert result["status"] == "done"
  ev, bits = result["eval"], result["eval_bits_per_byte"]
  assert set(ev) == set(bits) == {"val", "val/a", "val/b"}
  assert ev["val"] == pytest.approx((3 * ev["val/a"] + ev["val/b"]) / 4)
  counts = {"a": bytes_per_token.measure(a), "b": bytes_per_token.measure(b)}
  bpt = {n: c["bytes"] / c["targets"] for n, c in counts.items()}
  assert bpt["a"] != pytest.approx(bpt["b"], rel=1e-3)  # two texts: the weighting below is seen
  for n in ("a", "b"):
    assert bits[f"val/{n}"] == pytest.approx(ev[f"val/{n}"] / math.log(2) / bpt[n])
    assert result["val_byte_counts"]["sources"][n] == {
        **{k: counts[n][k] for k in ("bytes", "targets", "tokens_read")}, "bytes_per_token": bpt[n],
        "weight": 3.0 if n == "a" else 1.0}
  mixed = (3 * bpt["a"] + bpt["b"]) / 4  # bytes per token of text drawn 3:1
  assert result["val_bytes_per_token"] == pytest.approx(mixed)
  assert bits["val"] == pytest.approx(ev["val"] / math.log(2) / mixed)
  assert result["val_byte_counts"]["bytes"] == counts["a"]["bytes"] + counts["b"]["bytes"]
  with open(os.path.join(workdir, "result.json")) as f:
    assert json.load(f)["eval_bits_per_byte"] == bits
  # Rerun when finished: result.json is rewritten from the checkpoint, the sources' NLLs with it.
  from nsl.train import loop

  again = loop.Trainer(config, workdir, progress=False).run()
  for key in ("eval", "eval_bits_per_byte", "val_bytes_per_token", "val_byte_counts"):
    assert again[key] == result[key], key
