"""Planning tasks: path-star layout and splits, countdown generator / solver / checker, the task
data dir format read by the training pipeline, prompt masking from the answer token."""

import numpy as np
import pytest

from nsl.data import pipeline, prepare
from nsl.data.tasks import countdown as cd
from nsl.data.tasks import path_star as ps
from nsl.data.tasks import task_data


def test_path_star_layout_and_paths():
  task = ps.PathStar(d=3, l=4, n_train=200, n_test=50, seed=1)
  train, test, prompts, paths = task.generate()
  assert train.shape == (200, task.doc_len) and test.shape == (50, task.doc_len)
  assert task.doc_len == 3 * 9 + 4 + 4
  for doc in train[:20]:
    e = task.num_edges
    edges = doc[: 3 * e - 1].tolist() + [ps.SEP]
    edges = [tuple(edges[3 * k: 3 * k + 2]) for k in range(e)]
    assert all(edges_sep == ps.SEP for edges_sep in doc[2: 3 * e - 1: 3])
    assert doc[3 * e - 1] == ps.QUERY and doc[task.prompt_len - 1] == ps.ANSWER and doc[-1] == ps.EOS
    start, goal = doc[3 * e], doc[3 * e + 1]
    path = doc[task.prompt_len: task.prompt_len + task.l]
    assert path[0] == start and path[-1] == goal
    assert all((a, b) in edges for a, b in zip(path[:-1], path[1:]))  # the path follows edges
    assert sum(1 for u, _ in edges if u == start) == task.d  # the centre has d arms
  train_prompts = {row[: task.prompt_len].tobytes() for row in train}
  assert not any(p.tobytes() in train_prompts for p in prompts)  # test disjoint from train
  np.testing.assert_array_equal(task.generate()[0], train)  # fixed by the seed
  assert task.is_correct(prompts[0], paths[0], paths[0]) and not task.is_correct(prompts[0], paths[0][::-1], paths[0])


def test_countdown_generator_solver_checker():
  task = cd.Countdown(n_train=60, n_test=20, seed=0)
  train, test, prompts, answers = task.generate()
  assert train.shape == (60, 36) and prompts.shape == (20, task.prompt_len)
  held = set(task.heldout_targets().tolist())
  assert len(held) == 9
  assert not held & {int(r[8]) for r in train} and {int(r[8]) for r in test} <= held
  assert all((r[9:17] == cd.PAUSE).all() and r[17] == cd.ANSWER for r in train)
  for p, a in zip(prompts, answers):
    assert task.is_correct(p, a, a)
  # the REFERENCES example, an alternative solution, and wrong ones
  nums, target = [14, 83, 88, 91], 23
  ok = [83, cd.MINUS, 14, cd.EQ, 69, cd.COMMA, 91, cd.MINUS, 88, cd.EQ, 3, cd.COMMA, 69, cd.DIV, 3, cd.EQ, 23, cd.EOS]
  assert cd.check_solution(nums, target, ok) and cd.solve(nums, target) is not None
  bad = list(ok)
  bad[4] = 70
  assert not cd.check_solution(nums, target, bad)  # wrong arithmetic
  reuse = [83, cd.MINUS, 14, cd.EQ, 69, cd.COMMA, 83, cd.MINUS, 88, cd.EQ, 3]
  assert not cd.check_solution(nums, target, reuse)
  assert cd.solve([1, 1, 1, 1], 97) is None


def test_task_data_dir_feeds_the_pipeline(tmp_path):
  spec = "task:path_star:d=2,l=3,n_train=64,n_test=8,seed=0"
  assert task_data.is_task_source([spec]) and task_data.is_task_source(["task:s5"])
  assert not task_data.is_task_source(["task:s6"]) and not task_data.is_task_source([spec, spec])
  out = str(tmp_path / "ps")
  m = prepare.ensure_prepared(out, [spec], tokenizer="byte")  # the trainer's entry point
  assert m["task"]["doc_len"] == 3 * 4 - 1 + 4 + 3 + 1
  assert prepare.ensure_prepared(out, [spec], tokenizer="byte")["sources"] == [spec]
  with pytest.raises(Exception, match="holds"):
    prepare.ensure_prepared(out, ["task:path_star:d=2,l=3,n_train=65,n_test=8,seed=0"], tokenizer="byte")
  seq_len = m["task"]["doc_len"] - 1
  it = pipeline.make_train_iterator(out, seq_len, 8, seed=0)
  batch = next(it)
  assert (batch["tokens"][:, -1] == ps.EOS).all() and (batch["segment"] == 1).all()  # one problem per window
  prompts, answers = task_data.load_test(out)
  assert prompts.shape == (8, task_data.build(spec).prompt_len) and answers.shape == (8, 3)


def test_prompt_masking_counts_only_answers():
  from nsl.models import nextlat

  task = ps.PathStar(d=2, l=3, n_train=4, n_test=1)
  docs = task.generate()[0]
  batch = {"tokens": docs, "segment": np.ones_like(docs)}
  _, targets, _, w = nextlat.task_targets(batch, ps.ANSWER)
  w = np.asarray(w)
  assert (w.sum(1) == task.l + 1).all()  # the path and EOS
  np.testing.assert_array_equal(np.asarray(targets)[w > 0].reshape(4, -1), docs[:, task.prompt_len:])
