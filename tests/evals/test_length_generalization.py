"""nsl.evals.length_generalization: S5 final-state accuracy by N and arithmetic exact match by
operand count m, each equal to a direct forward pass; tasks are never mixed in one table."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from nsl.errors import NslError
from nsl.evals import length_generalization as lg
from tests.helpers import fake_run


def _config(data_dir, vocab, seq_len, family="standard"):
  from configs import base
  from nsl.models import lift

  c = base.get_config()
  c.family, c.model.variant = family, family
  c.model.vocab_size, c.model.d_model, c.model.n_layers, c.model.n_heads, c.model.d_ff = vocab, 16, 1, 2, 32
  c.model.attention_impl = "xla"
  c.data.path, c.data.seq_len = data_dir, seq_len
  if family == "lift":
    c.lift = lift.default_lift_config()
    c.lift.top_k, c.lift.adapt_fraction = 4, 0.0
  return c


@pytest.fixture(scope="module")
def task_dirs(tmp_path_factory):
  from nsl.data.tasks import arithmetic, s5

  root = tmp_path_factory.mktemp("tasks")
  s5.generate(str(root / "s5"), train_sequences=40, val_sequences=8, max_train_len=6, heldout_per_length=5,
              max_eval_len=8)
  arithmetic.generate(str(root / "arith"), train_sequences=40, val_sequences=8, heldout_per_count=6)
  return str(root / "s5"), str(root / "arith")


def _direct(fam, params, tokens):
  return np.asarray(jnp.argmax(fam.model.apply({"params": params}, jnp.asarray(tokens), jnp.ones_like(tokens)), -1))


def test_s5_table_matches_a_direct_forward_pass(task_dirs, tmp_path, capsys):
  from nsl.data.tasks import s5

  s5_dir, _ = task_dirs
  std, fam, params = fake_run(str(tmp_path / "std"), _config(s5_dir, 136, 17))
  lift_run, _, _ = fake_run(str(tmp_path / "lift"), _config(s5_dir, 136, 17, "lift"))
  (tmp_path / "lift" / "result.json").write_text('{"status": "done"}')
  assert lg.main([f"--runs={std},{lift_run}", "--lengths=1-3,8", "--per_length=5", "--batch_size=4",
                  f"--out={tmp_path / 'out'}"]) == 0
  record = json.load(open(tmp_path / "out" / "length_generalization.json"))
  assert record["task"] == "s5" and record["lengths"] == [1, 2, 3, 8]
  tokens, labels = s5.load_heldout(s5_dir)[3]
  want = float(np.mean(_direct(fam, params, tokens)[:, 3] == labels[:, -1]))
  assert record["accuracy"]["std"]["3"] == pytest.approx(want)
  assert "chance_from" in record["runs"]["lift"] and (tmp_path / "out" / "length_generalization.png").is_file()
  assert "chance = 0.008" in capsys.readouterr().out
  # the channel-off evaluation is recorded beside the own-state one, not over it
  assert lg.main([f"--runs={lift_run}", "--lengths=2", "--per_length=5", "--feed=bias", f"--out={tmp_path / 'b'}"]) == 0
  result = json.load(open(tmp_path / "lift" / "result.json"))
  assert result["length_generalization"]["view"] == "own"
  assert result["length_generalization_feed_bias"]["accuracy"].keys() == {"2"}


def test_arithmetic_scores_every_answer_token_and_tasks_do_not_mix(task_dirs, tmp_path):
  from nsl.data.tasks import arithmetic, s5

  s5_dir, arith_dir = task_dirs
  run, fam, params = fake_run(str(tmp_path / "arith"), _config(arith_dir, 16, arithmetic.WINDOW))
  assert lg.main([f"--runs={run}", f"--out={tmp_path / 'out'}"]) == 0
  record = json.load(open(tmp_path / "out" / "length_generalization.json"))
  assert record["task"] == "arithmetic" and record["lengths"] == list(range(2, 11))
  tokens, labels = s5.load_heldout(arith_dir)[2]
  pred = _direct(fam, params, tokens)
  want = float(np.mean(np.where(labels >= 0, pred == labels, True).all(axis=1)))
  assert record["accuracy"]["arith"]["2"] == pytest.approx(want)
  s5_run, _, _ = fake_run(str(tmp_path / "s5run"), _config(s5_dir, 136, 17))
  with pytest.raises(NslError, match="one task"):
    lg.main([f"--runs={run},{s5_run}", f"--out={tmp_path / 'out2'}"])


def test_a_grid_root_is_scored_once_and_grouped_over_seeds(task_dirs, tmp_path, capsys):
  s5_dir, _ = task_dirs
  root = tmp_path / "root"
  for arm, seeds in (("std", (0, 1)), ("lift", (0,))):
    for seed in seeds:
      d, _, _ = fake_run(str(root / f"seed{seed}-{arm}-abc"), _config(s5_dir, 136, 17, "standard" if arm == "std" else "lift"),
                         seed=seed)
      (root / f"seed{seed}-{arm}-abc" / "cell.json").write_text(json.dumps({"labels": {"seed": f"seed{seed}", "arm": arm}}))
      (root / f"seed{seed}-{arm}-abc" / "result.json").write_text('{"status": "done"}')
  (root / "pending-xyz").mkdir()  # a cell that is not done is left out
  (root / "pending-xyz" / "cell.json").write_text(json.dumps({"labels": {"seed": "seed2", "arm": "std"}}))
  args = [f"--root={root}", "--lengths=1-3,8", "--per_length=5", "--batch_size=4"]
  assert lg.main(args) == 0
  record = json.load(open(root / "length_generalization.json"))
  rows = {r["group"]: r for r in record["groups"]["rows"]}
  assert rows["std"]["seeds"] == ["seed0", "seed1"] and rows["lift"]["seeds"] == ["seed0"]
  a0, a1 = (record["accuracy"][f"seed{s}-std-abc"]["3"] for s in (0, 1))
  assert rows["std"]["mean"]["3"] == pytest.approx((a0 + a1) / 2)
  assert rows["std"]["solved_to"] == [lg.solved_to({int(n): v for n, v in record["accuracy"][r].items()})
                                     for r in rows["std"]["runs"]]
  assert "| `std` | 2 |" in capsys.readouterr().out
  # a second call reuses every cell's record: a tampered record comes back as it is
  res = json.load(open(root / "seed0-std-abc" / "result.json"))
  res["length_generalization"]["accuracy"]["3"] = 0.123
  (root / "seed0-std-abc" / "result.json").write_text(json.dumps(res))
  assert lg.main(args) == 0
  assert json.load(open(root / "length_generalization.json"))["accuracy"]["seed0-std-abc"]["3"] == 0.123
  assert lg.main(args + ["--force"]) == 0
  assert json.load(open(root / "length_generalization.json"))["accuracy"]["seed0-std-abc"]["3"] == pytest.approx(a0)


def test_solved_to_and_chance_from():
  assert lg.solved_to({1: 1.0, 2: 0.995, 3: 0.5, 4: 1.0}) == 2 and lg.solved_to({1: 0.2}) == 0
  assert lg.chance_from({1: 1.0, 2: 0.001, 3: 0.5, 4: 0.001, 5: 0.0}) == 4
