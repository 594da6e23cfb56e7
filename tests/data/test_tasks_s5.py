"""The S5 and arithmetic task generators, their data dirs, and labelled batches in the pipeline."""

from __future__ import annotations


import jax.numpy as jnp
import numpy as np

from nsl.data import pipeline
from nsl.data.tasks import arithmetic, s5
from nsl.nn import cross_entropy


def test_generators_and_composition_table():
  assert len(set(s5.GENERATOR_PERMS)) == 12 and s5.NUM_GENERATORS == 12
  assert tuple(s5.PERMS[0]) == (0, 1, 2, 3, 4) and len(s5.PERMS) == 120
  # table[g, s] is g∘s: (g∘s)[i] = g[s[i]], checked directly.
  for g in range(12):
    for s in (0, 17, 119):
      want = tuple(s5.GENERATOR_PERMS[g][s5.PERMS[s][i]] for i in range(5))
      assert tuple(s5.PERMS[s5.TABLE[g, s]]) == want
  # The 12 generators generate all of S5 (closure from the identity).
  seen, frontier = {0}, {0}
  while frontier:
    frontier = {int(s5.TABLE[g, s]) for s in frontier for g in range(12)} - seen
    seen |= frontier
  assert len(seen) == 120


def test_sample_labels_are_running_compositions():
  rng = np.random.default_rng(0)
  tok, lab = s5.sample(rng, 50, rng.integers(1, 9, 50), width=9)
  for row_t, row_l in zip(tok, lab):
    n = int((row_t >= 0).sum()) - 1
    assert row_t[0] == row_l[0] < 120 and (row_t[n + 1:] == -1).all()
    state = int(row_t[0])
    for t in range(1, n + 1):
      state = int(s5.TABLE[row_t[t] - s5.GENERATOR_BASE, state])
      assert row_l[t] == state


def test_s5_dir_pipeline_batches_and_heldout(tmp_path):
  d = str(tmp_path / "s5")
  s5.generate(d, train_sequences=64, val_sequences=8, max_train_len=16, heldout_per_length=5, max_eval_len=20)
  it = pipeline.make_train_iterator(d, seq_len=17, global_batch_size=4, seed=0)
  b = next(it)
  assert set(b) == {"tokens", "segment", "labels"} and b["labels"].shape == (4, 18)
  for row_t, row_l in zip(b["tokens"], b["labels"]):
    n = int(np.argmax(row_t == s5.EOS_ID))  # one sequence per window, then EOS padding
    assert 1 <= n - 1 <= 16 and (row_l[n:] == -1).all() and (row_l[:n] >= 0).all()
  inputs, targets, seg, w = cross_entropy.next_token_targets({k: jnp.asarray(v) for k, v in b.items()})
  np.testing.assert_array_equal(targets, np.maximum(b["labels"][:, :-1], 0))
  np.testing.assert_array_equal(w, (b["labels"][:, :-1] >= 0))
  ev = list(pipeline.make_eval_batches(d, "val", seq_len=17, batch_size=3))
  assert ev[-1]["labels"].shape == (3, 18) and (ev[-1]["labels"][ev[-1]["segment"][:, 0] == 0] == -1).all()
  held = s5.load_heldout(d)
  assert sorted(held) == list(range(1, 21))
  tok20, lab20 = held[20]
  assert tok20.shape == lab20.shape == (5, 21)
  # Held-out sequences come from another seed stream than the training ones.
  assert not any((tok20[:, :3] == row[:3]).all(1).any() for row in b["tokens"])


def test_plain_corpus_batches_unchanged(tmp_path, make_corpus):
  from nsl.data import prepare

  make_corpus(str(tmp_path / "txt"), num_docs=6)
  d = str(tmp_path / "data")
  prepare.prepare(d, [str(tmp_path / "txt" / "*.txt")], tokenizer="byte", val_fraction=0.2)
  b = next(pipeline.make_train_iterator(d, seq_len=16, global_batch_size=2, seed=0))
  assert set(b) == {"tokens", "segment"} and b["tokens"].dtype == np.int32


def test_arithmetic_problems_and_labels(tmp_path):
  toks, value = arithmetic.encode_problem([3, 5, 9], [1, -1])
  assert value == -1
  text = "".join(arithmetic.VOCAB[t] if t != arithmetic.EOS_ID else "$" for t in toks)
  assert text == "3+5-9=-1$"
  labels = arithmetic.labels_for(toks)
  assert labels[:5] == [-1] * 5 and labels[5:] == [arithmetic.MINUS, 1, arithmetic.EOS_ID, -1]
  rng = np.random.default_rng(0)
  for m in (2, 10):
    tok, lab = arithmetic.sample(rng, 20, m)
    for row in tok:
      eq = int(np.argmax(row == arithmetic.EQUALS))
      assert eq == 2 * m - 1
      expr = "".join(arithmetic.VOCAB[t] for t in row[:eq])
      end = int(np.argmax(row[eq:] == arithmetic.EOS_ID)) + eq
      assert int("".join(arithmetic.VOCAB[t] for t in row[eq + 1:end])) == eval(expr)
  d = str(tmp_path / "arith")
  arithmetic.generate(d, train_sequences=16, val_sequences=4, heldout_per_count=3)
  b = next(pipeline.make_train_iterator(d, seq_len=arithmetic.WINDOW, global_batch_size=4, seed=0))
  assert b["labels"].shape == (4, arithmetic.WINDOW + 1)
  perfect = np.eye(arithmetic.VOCAB_SIZE)[np.maximum(b["labels"], 0)]
  assert arithmetic.answer_accuracy(perfect, b["labels"]) == 1.0


def test_task_sources_generate_s5_and_arithmetic_on_first_use(tmp_path):
  import pytest

  from nsl.data import prepare
  from nsl.errors import ConfigError, DataError

  src = "task:s5:train_sequences=40,val_sequences=8,max_train_len=4,heldout_per_length=2,max_eval_len=6"
  m = prepare.ensure_prepared(str(tmp_path / "s5"), sources=[src], tokenizer="task:s5")
  assert m["task"]["name"] == "s5" and m["task"]["max_eval_len"] == 6
  assert prepare.ensure_prepared(str(tmp_path / "s5"), sources=[src], tokenizer="task:s5") == m  # reused
  a = prepare.ensure_prepared(str(tmp_path / "ar"), sources=["task:arithmetic:train_sequences=30,val_sequences=4,"
                                                             "heldout_per_count=2"], tokenizer="task:arithmetic")
  assert a["task"]["name"] == "arithmetic"
  with pytest.raises(DataError, match="does not hold the arithmetic task"):
    prepare.ensure_prepared(str(tmp_path / "s5"), sources=["task:arithmetic"], tokenizer="task:arithmetic")
  with pytest.raises(ConfigError, match="task:s5"):
    prepare.ensure_prepared(str(tmp_path / "x"), sources=["task:s5:colour=3"], tokenizer="task:s5")
