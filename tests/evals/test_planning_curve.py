"""`nsl.evals.planning --all_checkpoints`: every kept checkpoint scored as the final one would be,
joined with the training record at its step, and kept across reruns (only new steps scored)."""

import json
import logging
import os

import flax.linen as nn
import jax
import numpy as np

from configs import nextlat as nextlat_configs
from nsl import checkpoint
from nsl import config as nsl_config
from nsl.data.tasks import path_star, planning_dir
from nsl.evals import planning, planning_study
from nsl.models import registry
from nsl.train import state as train_state

SPEC = "task:path_star:d=2,l=3,n_train=32,n_test=12,seed=0"


def _run(tmp_path):
  data = str(tmp_path / "data")
  planning_dir.write(data, SPEC, path_star.PathStar(d=2, l=3, n_train=32, n_test=12, seed=0))
  c = nextlat_configs.path_star_data(nextlat_configs.gpt_path_star(), d=2, l=3, n_train=32, n_test=12)
  c.data.path = data
  c.model.update(d_model=32, n_layers=1, n_heads=2, d_ff=64)
  nsl_config.validate(c)
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(nsl_config.to_dict(c), f)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step, ce in ((5, 3.0), (10, 2.5), (15, 2.0)):
      f.write(json.dumps({"step": step, "ce": ce, "loss": ce, "tokens": step}) + "\n")
    f.write(json.dumps({"step": 15, "eval": {"val": 9.0}}) + "\n")  # not a training line
  return c, registry.get_family(c), workdir


def _state(family, config, seed):
  params = nn.unbox(family.init(jax.random.PRNGKey(seed)))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 40.0  # sharp: seeds answer differently
  return train_state.create(params, train_state.make_optimizer(config))


def _save(workdir, steps_seeds, family, config):
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), keep=10, async_save=False)
  for step, seed in steps_seeds:
    ckpt.save(step, _state(family, config, seed), None, {})
  ckpt.close()


def _fingerprint(params) -> float:
  return round(float(np.asarray(params["embed"]["embedding"]).sum()), 3)


def test_every_checkpoint_scored_with_its_train_record(tmp_path, monkeypatch, caplog):
  config, family, workdir = _run(tmp_path)
  _save(workdir, [(10, 0), (20, 1)], family, config)
  task, prompts, answers = planning.load_test_set(config, None, None)
  direct = {s: planning.score(task, family, _state(family, config, seed).params, prompts, answers, 8)
            for s, seed in ((10, 0), (20, 1))}
  decoded = []  # which parameters each point was decoded with (untrained models score alike)
  greedy = planning.greedy_batch
  monkeypatch.setattr(planning, "greedy_batch", lambda f, p, *a: decoded.append(_fingerprint(p)) or greedy(f, p, *a))
  curve = planning.evaluate_curve(workdir, batch_size=8)
  assert [p["step"] for p in curve["points"]] == [10, 20]
  per_step = [_fingerprint(_state(family, config, seed).params) for seed in (0, 1)]
  assert per_step[0] != per_step[1] and sorted(set(decoded), key=decoded.index) == per_step
  for p in curve["points"]:
    for k in ("accuracy", "first_step_acc"):
      assert p[k] == direct[p["step"]][k]
  assert curve["points"][0]["train"] == {"ce": 2.5, "loss": 2.5, "logged_step": 10}
  assert curve["points"][1]["train"]["logged_step"] == 15  # the last logged step at or before 20
  assert curve["chance_first_step"] == 0.5 and curve["test_problems"] == 12
  with open(os.path.join(workdir, "planning_curve.json")) as f:
    assert json.load(f) == curve

  # Rerun after one more checkpoint: only the new step is scored, the old points are kept.
  _save(workdir, [(30, 2)], family, config)
  scored = []
  real = planning.score
  monkeypatch.setattr(planning, "score", lambda *a, **k: scored.append(1) or real(*a, **k))
  with caplog.at_level(logging.INFO, logger="absl"):
    assert planning.main(["--workdir", workdir, "--all_checkpoints", "--batch_size=8"]) == 0
  assert len(scored) == 1
  assert not [r for r in caplog.records if r.name == "absl" and r.levelno >= logging.WARNING]  # Orbax kept quiet
  with open(os.path.join(workdir, "planning_curve.json")) as f:
    again = json.load(f)
  assert [p["step"] for p in again["points"]] == [10, 20, 30]
  assert again["points"][:2] == curve["points"]


def test_root_study_groups_seeds_and_reports_each_seeds_last_point(tmp_path):
  """`--root`: the done cells of a grid root, grouped by labels but the seed; each row's per-seed
  values are the cells' last curve points (scored directly here), its mean their mean; a cell
  that is not done is left out."""
  config, family, workdir = _run(tmp_path)
  root = tmp_path / "root"
  direct = {}
  for seed, done in ((0, True), (1, True), (2, False)):
    cell = root / f"seed{seed}-g-gpt"
    os.makedirs(cell)
    for name in ("config.json", "metrics.jsonl"):
      with open(os.path.join(workdir, name)) as src, open(cell / name, "w") as dst:
        dst.write(src.read())
    with open(cell / "cell.json", "w") as f:
      json.dump({"labels": {"config": "gpt", "seed": f"seed{seed}", "size": "g"}}, f)
    with open(cell / "result.json", "w") as f:
      json.dump({"status": "done" if done else "preempted"}, f)
    _save(str(cell), [(10, 5 + seed), (20, 10 + seed)], family, config)
    task, prompts, answers = planning.load_test_set(config, None, None)
    direct[f"seed{seed}"] = planning.score(task, family, _state(family, config, 10 + seed).params, prompts, answers, 8)
  assert planning_study.main(["--root", str(root), "--batch_size=8"]) == 0
  with open(root / "planning_study.json") as f:
    study = json.load(f)
  (row,) = study["groups"]
  assert row["group"] == "gpt-g" and row["seeds"] == ["seed0", "seed1"] and row["steps"] == [20, 20]
  for key in ("accuracy", "first_step_acc"):
    want = [direct[s][key] for s in ("seed0", "seed1")]
    assert row[key]["per_seed"] == want and abs(row[key]["mean"] - np.mean(want)) < 1e-12
  assert row["chance_first_step"] == 0.5
  assert (root / "planning_study.png").stat().st_size > 0
  assert "`gpt-g` | 2 | 20 |" in (root / "planning_study.md").read_text()
  assert not (root / "seed2-g-gpt" / "planning_curve.json").exists()
  # --unfinished: the preempted cell joins, up to its latest checkpoint
  assert planning_study.main(["--root", str(root), "--batch_size=8", "--unfinished"]) == 0
  with open(root / "planning_study.json") as f:
    (row,) = json.load(f)["groups"]
  assert row["seeds"] == ["seed0", "seed1", "seed2"]
  assert row["accuracy"]["per_seed"][2] == direct["seed2"]["accuracy"]


def test_sampled_evaluation_is_reproducible_and_kept_apart_from_greedy(tmp_path):
  """`--temperature=1`: answers drawn at T = 1 (NextLat's path-star protocol), the same draws for
  the same seed, other draws for another seed, recorded with their temperature and seed in their
  own file beside the greedy one; a negative temperature is one line, exit 2."""
  config, family, workdir = _run(tmp_path)
  _save(workdir, [(10, 0)], family, config)
  task, prompts, answers = planning.load_test_set(config, None, None)
  params = _state(family, config, 0).params
  flat = nn.unbox(family.init(jax.random.PRNGKey(0)))  # untrained: near-uniform next-token odds
  draws = {seed: planning._answers(family, flat, prompts, task.answer_len(), 8, 1.0, seed) for seed in (0, 1)}
  np.testing.assert_array_equal(draws[0], planning._answers(family, flat, prompts, task.answer_len(), 8, 1.0, 0))
  assert not np.array_equal(draws[0], draws[1])

  assert planning.main(["--workdir", workdir, "--batch_size=8"]) == 0
  assert planning.main(["--workdir", workdir, "--batch_size=8", "--temperature=1", "--sample_seed=3"]) == 0
  with open(os.path.join(workdir, "planning.json")) as f:
    g = json.load(f)
  with open(os.path.join(workdir, "planning_T1.json")) as f:
    s = json.load(f)
  assert g["temperature"] == 0.0 and "sample_seed" not in g
  assert s["temperature"] == 1.0 and s["sample_seed"] == 3
  want = planning.score(task, family, params, prompts, answers, 8, 1.0, 3)
  assert s["accuracy"] == want["accuracy"] and s["first_step_acc"] == want["first_step_acc"]
  assert planning.main(["--workdir", workdir, "--temperature=-1"]) == 2
