"""Evaluators during training (config.evals): the trainer runs them at every eval step and logs
"<name>/<metric>"; a bad spec is one line, exit status 2; an empty evals section leaves grid ids alone."""

import json
import os
import re
import shutil

import jax
import numpy as np
import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError
from nsl.evals import evaluators, specs
from nsl.train import loop
from tests.helpers import make_corpus, tiny_config

ARC = [{"question": "Which word is common?", "choices": {"text": ["the", "zqxj"], "label": ["A", "B"]}, "answerKey": "A"},
       {"question": "Pick one", "choices": {"text": ["and", "of the", "xq"], "label": ["1", "2", "3"]}, "answerKey": "1"},
       {"question": "Another", "choices": {"text": ["yes", "no"], "label": ["A", "B"]}, "answerKey": "B"}]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("evals")
  data = make_corpus(str(root))
  other = str(root / "other")
  shutil.copytree(data, other)  # the same tokens: its NLL must equal the validation NLL
  arc = root / "arc.jsonl"
  arc.write_text("".join(json.dumps(r) + "\n" for r in ARC))
  return data, other, str(arc)


def test_the_trainer_logs_two_evaluators_at_every_eval_step(corpus, tmp_path):
  data, other, arc = corpus
  config = tiny_config(data, **{"train.steps": 6, "train.eval_every": 3})
  config.evals = {"other": {"kind": "nll", "data": other},
                  "arc": {"kind": "zeroshot", "task": "arc_easy", "data": arc, "batch_size": 4}}
  workdir = str(tmp_path / "run")
  loop.Trainer(config, workdir, progress=False, devices=jax.devices()[:1]).run()
  lines = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = [r for r in lines if "eval_val_nll" in r]
  assert [r["step"] for r in evals] == [3, 6]
  for r in evals:
    # nll on a copy of the validation data over train.eval_batches: the trainer's own number
    assert r["other/nll"] == pytest.approx(r["eval_val_nll"], rel=1e-6)
    assert 0.0 <= r["arc/acc"] <= 1.0 and 0.0 <= r["arc/acc_norm"] <= 1.0
    assert r["arc/n"] == len(ARC)
  assert evals[1]["other/nll"] < evals[0]["other/nll"]  # evaluated on the live, trained parameters


@pytest.mark.parametrize("evals, message", [
    ({"x": {"kind": "bleu"}}, "config.evals.x.kind='bleu' is unknown"),
    ({"x": {"kind": "nll"}}, "config.evals.x.data is required"),
    ({"x": {"kind": "nll", "data": "d", "batchez": 2}},
     "config.evals.x.batchez: not a field of a 'nll' evaluator (did you mean 'batches'?)"),
    ({"x": {"kind": "planning", "batch_size": 0}}, "config.evals.x.batch_size=0 must be >= 1"),
    ({"x": {"kind": "planning", "temperature": "hot"}}, "config.evals.x.temperature='hot' must be a number"),
    ({"x": {"kind": "planning", "batch_size": True}}, "config.evals.x.batch_size=True must be an integer"),
    ({"x": {"kind": "zeroshot", "task": "mmlu", "data": "f"}}, "config.evals.x.task='mmlu' is unknown"),
    ({"x-y": {"kind": "nll", "data": "d"}}, "config.evals.x-y: an evaluator's name"),
])
def test_bad_specs_name_the_field(evals, message):
  from configs import base

  c = base.get_config()
  c.evals = evals
  with pytest.raises(ConfigError, match=re.escape(message)):
    specs.validate(c)


def test_a_bad_evaluator_is_one_line_and_exit_2(corpus, tmp_path, capsys):
  from nsl import launch

  data, _, _ = corpus
  missing = str(tmp_path / "no_such_dir")
  for kind, message in (("nlll", "config.evals.wiki.kind='nlll' is unknown"),
                        ("nll", f"config.evals.wiki (nll): data dir {missing} does not exist")):
    cfg = tmp_path / f"{kind}.py"
    cfg.write_text("from tests.helpers import tiny_config\n"
                   "def get_config():\n"
                   f"  c = tiny_config({data!r})\n"
                   f"  c.evals = {{'wiki': {{'kind': {kind!r}, 'data': {missing!r}}}}}\n"
                   "  return c\n")
    rc = launch.main([f"--config={cfg}", f"--workdir={tmp_path / 'run'}", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err


def test_length_generalization_and_planning_on_sharded_live_params(tmp_path):
  """The two task evaluators on parameters sharded over the 8-device mesh, as the trainer holds
  them, score what the stand-alone commands' functions score on one device."""
  from configs import base, nextlat as nextlat_configs
  from nsl.data.tasks import path_star, planning_dir, s5
  from nsl.evals import length_generalization as lg, planning
  from nsl.models import registry
  from nsl.train import program

  s5_dir, ps_dir = str(tmp_path / "s5"), str(tmp_path / "ps")
  s5.generate(s5_dir, train_sequences=16, val_sequences=8, max_train_len=4, heldout_per_length=8, max_eval_len=6)
  planning_dir.write(ps_dir, "task:path_star:d=2,l=3,n_train=32,n_test=8,seed=0",
                     path_star.PathStar(d=2, l=3, n_train=32, n_test=8, seed=0))
  c = base.get_config()
  c.model.update(vocab_size=136, d_model=16, n_layers=1, n_heads=2, d_ff=32, attention_impl="xla")
  c.data.path, c.data.seq_len = s5_dir, 16
  c.evals = {"s5": {"kind": "length_generalization", "lengths": "1-3,6", "per_length": 8, "batch_size": 8}}
  p = nextlat_configs.path_star_data(nextlat_configs.gpt_path_star(), d=2, l=3, n_train=32, n_test=8)
  p.data.path = ps_dir
  p.model.update(d_model=16, n_layers=1, n_heads=2, d_ff=32)
  p.evals = {"plan": {"kind": "planning", "batch_size": 8}}
  for config in (c, p):
    prog = program.Program(config, jax.devices())
    with prog.mesh_context():
      state = prog.init(jax.random.PRNGKey(0))
    ctx = evaluators.Context(config, prog.family, prog.mesh, prog.eval_step, "", 8)
    with prog.mesh_context():
      got = evaluators.run_all(evaluators.build(ctx), state.params)
    assert len(prog.mesh.devices.flat) == 8
    host = jax.tree.map(np.asarray, jax.device_get(state.params))
    family = registry.get_family(config)
    if config is c:
      want = lg.evaluate(family, host, s5_dir, "1-3,6", 8, "own", 8)[2]
      assert got == {**{f"s5/acc_{n}": v for n, v in want.items()}, "s5/solved_to": float(lg.solved_to(want))}
    else:
      task, prompts, answers = planning.load_test_set(config, None, None)
      want = planning.score(task, family, host, prompts, answers, 8)
      assert got == {"plan/accuracy": want["accuracy"], "plan/first_step_acc": want["first_step_acc"]}


def test_empty_evals_log_and_profile_leave_grid_ids_alone():
  from configs import base
  from nsl.scaling import grid

  c = nsl_config.to_dict(base.get_config())
  before = {k: v for k, v in c.items() if k not in ("evals", "log")}
  before["train"] = {k: v for k, v in c["train"].items() if k != "profile_steps"}
  assert grid.config_hash(c) == grid.config_hash(before)
  logged = dict(c, log=dict(c["log"], wandb=True), train=dict(c["train"], profile_steps=[2, 3]))
  assert grid.config_hash(logged) == grid.config_hash(before)
  assert grid.config_hash(dict(c, evals={"x": {"kind": "nll", "data": "d"}})) != grid.config_hash(before)
