"""Evaluators during training (big_vision's pattern; docs/guide/evaluation.md#evaluators-during-training).

`build` turns `config.evals` (its kinds: `nsl.evals.kinds`; resolved by `nsl.evals.specs`) into
callables `params -> {metric: value}` that the trainer runs every `train.eval_every` and at the
end, beside the validation NLL; `run_all` prefixes each metric with its evaluator's name
("wiki/nll", "arc/acc"). Each kind calls the code of its stand-alone command on the live
parameters, so the numbers are the command's (a kind's builder takes its resolved spec, an
instance of the kind):

  nll                    `nsl.evals.nll`: the trainer's eval step over another data dir's split
  zeroshot               `nsl.evals.zeroshot`: one task's JSONL through the same scorer
  length_generalization  `nsl.evals.length_generalization.evaluate`: accuracy per length
  planning               `nsl.evals.planning.score`: exact match on the task's test set

What can be read before training is read when the evaluators are built (data dirs, task files,
tokenizer agreement), so a mistake stops the run before its first step, as one line naming the
evaluator. The jitted functions are built once here and reused at every evaluation.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from nsl.errors import ConfigError, NslError
from nsl.evals import kinds, specs

Evaluator = Callable[[Any], dict[str, float]]


@dataclasses.dataclass
class Context:
  """What the trainer lends its evaluators: its config, family and mesh, its compiled eval step,
  its run's data dir and manifest, and the processes' layout."""

  config: Any
  family: Any
  mesh: Any
  eval_step: Callable
  eval_suffix: str
  batch_size: int
  process_index: int = 0
  process_count: int = 1

  @property
  def own_dir(self) -> str:
    return str(self.config.data.path)


def _nll(spec: kinds.Nll, ctx: Context) -> Evaluator:
  from nsl.data import pipeline
  from nsl.evals import nll

  nll.check_data(ctx.config, spec.data, ctx.own_dir, flag="data")
  batches = pipeline.make_eval_batches(
      spec.data, spec.split, seq_len=int(ctx.config.data.seq_len), batch_size=ctx.batch_size,
      max_batches=spec.batches or int(ctx.config.train.eval_batches), process_index=ctx.process_index,
      process_count=ctx.process_count)

  def evaluate(params):
    total, count = nll.summed_nll(ctx.eval_step, params, batches, ctx.mesh)
    return {"nll" + ctx.eval_suffix: total / max(count, 1.0)}

  return evaluate


def _zeroshot(spec: kinds.Zeroshot, ctx: Context) -> Evaluator:
  from nsl.data import prepare, tokenizers
  from nsl.evals import common, zeroshot, zeroshot_tasks

  limit = spec.limit or None
  zeroshot_tasks.read_examples(spec.data, spec.task, limit)  # a malformed file fails now
  manifest = prepare.load_manifest(ctx.own_dir)
  tokenizer = tokenizers.load_tokenizer(manifest["tokenizer"], ctx.own_dir)
  scorer = common.make_scorer(ctx.family, ctx.config)

  def evaluate(params):
    loglik = zeroshot.make_loglik(ctx.family, params, ctx.config, tokenizer, int(manifest["eos_id"]),
                                  spec.batch_size, scorer=scorer)
    score = zeroshot.score_tasks(loglik, [(spec.task, spec.data)], limit)[spec.task]
    return {k: v for k, v in score.items() if isinstance(v, (int, float)) and k != "limit"}

  return evaluate


def _length_generalization(spec: kinds.LengthGeneralization, ctx: Context) -> Evaluator:
  from nsl.evals import length_generalization as lg

  data = spec.data or ctx.own_dir
  lengths = lg.parse_lengths(spec.lengths or lg.TASKS[lg.task_name(data)]["lengths"])
  if not lengths:
    raise ConfigError(f"lengths={spec.lengths!r} names no length")
  forward = lg.make_forward(ctx.family, spec.view)
  spec_lengths = ",".join(map(str, lengths))

  def evaluate(params):
    _, _, acc = lg.evaluate(ctx.family, params, data, spec_lengths, spec.per_length, spec.view, spec.batch_size,
                            forward)
    return {**{f"acc_{n}": v for n, v in acc.items()}, "solved_to": lg.solved_to(acc)}

  return evaluate


def _planning(spec: kinds.Planning, ctx: Context) -> Evaluator:
  from nsl.evals import planning

  task, prompts, answers = planning.load_test_set(ctx.config, spec.limit or None, spec.data or None)

  def evaluate(params):
    # Scalars only (logged metrics); the per-position teacher-forced list is the CLI's.
    out = planning.score(task, ctx.family, params, prompts, answers, spec.batch_size, spec.temperature,
                         spec.sample_seed, teacher_forced=False)
    return {k: v for k, v in out.items() if k != "seconds"}

  return evaluate


# Each kind's builder, from its resolved spec (an instance of the kind) and the trainer's context.
BUILDERS: dict[type[kinds.Kind], Callable[[Any, Context], Evaluator]] = {
    kinds.Nll: _nll, kinds.Zeroshot: _zeroshot, kinds.LengthGeneralization: _length_generalization,
    kinds.Planning: _planning}
assert set(BUILDERS) == set(kinds.KINDS.values())


def build(ctx: Context) -> dict[str, Evaluator]:
  """{name: evaluator} of `ctx.config.evals`; ConfigError naming the evaluator for anything that
  would fail later (a missing data dir or file, another tokenizer, a kind that needs one process)."""
  out = {}
  for name, spec in specs.resolve_all(ctx.config).items():
    kind = spec.kind
    if spec.one_process and ctx.process_count > 1:
      raise ConfigError(f"config.evals.{name}: a {kind!r} evaluator scores on one process, and this run has "
                        f"{ctx.process_count}; drop it and score the finished run with python -m {spec.command}")
    try:
      out[name] = BUILDERS[type(spec)](spec, ctx)
    except NslError as e:
      raise ConfigError(f"config.evals.{name} ({kind}): {e}") from e
  return out


def run_all(evaluators: dict[str, Evaluator], params) -> dict[str, float]:
  """Every evaluator's metrics on `params`, as "<name>/<metric>"."""
  out = {}
  for name, evaluate in evaluators.items():
    out.update({f"{name}/{k}": float(v) for k, v in evaluate(params).items()})
  return out
