"""Exact-match accuracy of a trained run on its planning task's test set (greedy or sampled).

  python -m nsl.evals.planning --workdir=runs/nextlat_path_star [--limit=1000] [--batch_size=250]
  python -m nsl.evals.planning --workdir=RUN --temperature=1.0 [--sample_seed=0]   # sampled, as NextLat's paper
  python -m nsl.evals.planning --workdir=RUN --all_checkpoints [--limit=500]
  python -m nsl.evals.planning_study --root=GRID_ROOT [--limit=500]   # a grid's table and curves

Reads the run's config.json and latest checkpoint, the task test set of its data dir
(`task_test.npz`, nsl/data/tasks/task_data.py), decodes every prompt greedily with the family's
decoder (`Family.decoder()`: the shared KV-cache decoder for standard, sps, nextlat, mtp; LIFT
with its own-state feedback; the double decoder's own; batched, all prompts of a task have the
same length) for the task's answer length, and scores with the task's checker (path-star: the ℓ path tokens exactly; countdown: any correct solution).
Prints one JSON line and writes it to WORKDIR/planning.json. For path-star it also reports the
accuracy of the first decision after the start node (`first_step_acc`): the token a
next-token-trained model gets only by chance 1/d ("Clever Hans", Bachmann & Nagarajan 2024).
Every record also carries `teacher_forced_acc`, one accuracy per answer position with the true
prefix given: which step of the answer the model has learnt, whatever decoding makes of it.

`--temperature=T` > 0 samples the answers at temperature T instead of decoding greedily (the
NextLat authors evaluate path-star by sampling at T = 1; see docs/papers/nextlat.md). The draws
are reproducible: batch i uses the key fold_in(PRNGKey(--sample_seed), i), so the same run,
test set, batch size and seed give the same answers. The record carries `temperature` and
`sample_seed`, and a sampled run writes planning_T{T}.json / planning_curve_T{T}.json beside the
greedy files, so the two evaluations never overwrite or mix with each other.

`--all_checkpoints`: the learning curve instead. Every kept checkpoint of the run (train with a
large `checkpoint.keep`) is restored and scored the same way, and each point carries the
training record at that step (the last metrics.jsonl line at or before it: `ce`, and for
NextLat `next_h` = L_next-h and `kl`), so first-decision accuracy and L_next-h are read against
steps from one file, WORKDIR/planning_curve.json. Points already in that file (same test
problems) are kept, so rerunning after more checkpoints scores only the new ones.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from nsl.errors import NslError, cli_main
from nsl import runs
from nsl.evals import common, kinds


def load_run(workdir: str):
  """(config, family, params) of a trained run: `nsl.runs.load_run`."""

  return runs.load_run(workdir)


def greedy_batch(family, params, prompts_BN: np.ndarray, new_tokens: int) -> np.ndarray:
  """Greedy continuation [B, new_tokens] of same-length prompts with the family's decoder
  (`nsl.models.decoder`: the shared KV-cache decoder, LIFT's own-state feedback decode)."""
  import jax.numpy as jnp

  from nsl.models import decoder

  return np.asarray(decoder.require(family, "planning").generate(params, jnp.asarray(prompts_BN, jnp.int32),
                                                                 new_tokens)[0])


def sampled_batch(family, params, prompts_BN: np.ndarray, new_tokens: int, temperature: float, key) -> np.ndarray:
  """Answers [B, new_tokens] drawn at `temperature` with the family's decoder (`nsl.models.decoder`)."""
  import jax.numpy as jnp

  from nsl.models import decoder

  out = decoder.require(family, "planning").generate(params, jnp.asarray(prompts_BN, jnp.int32), new_tokens,
                                                     temperature=temperature, rng=key)
  return np.asarray(out[0])


def _answers(family, params, prompts, new_tokens: int, batch_size: int, temperature: float, sample_seed: int):
  if temperature <= 0.0:
    return np.concatenate([greedy_batch(family, params, prompts[i:i + batch_size], new_tokens)
                           for i in range(0, len(prompts), batch_size)])
  import jax

  base = jax.random.PRNGKey(sample_seed)
  return np.concatenate([sampled_batch(family, params, prompts[i:i + batch_size], new_tokens, temperature,
                                       jax.random.fold_in(base, i // batch_size))
                         for i in range(0, len(prompts), batch_size)])


def file_suffix(temperature: float) -> str:
  return "" if temperature <= 0.0 else f"_T{temperature:g}"


def load_test_set(config, limit: int | None, data_dir: str | None, workdir: str | None = None):
  """(task, prompts, answers) of the planning task dir `data_dir` (None: the run's own, where the run
  in `workdir` read it, `nsl.data.rundata.data_dir`; without `workdir`, config data.path), the first
  `limit` problems: what this command and the trainer's planning evaluator score."""
  from nsl.data import rundata
  from nsl.data.tasks import task_data

  data_dir = data_dir or (rundata.data_dir(workdir, config) if workdir else str(config.data.path))
  task = task_data.task_of(data_dir)
  prompts, answers = task_data.load_test(data_dir)
  if limit:
    prompts, answers = prompts[:limit], answers[:limit]
  return task, prompts, answers


def teacher_forced_acc(family, params, prompts_BP: np.ndarray, answers_BA: np.ndarray,
                       batch_size: int) -> list[float]:
  """Per answer position i, how often the family's argmax next token given the true prefix (the
  prompt and answer tokens < i) is answer token i (`Family.token_logits`, one forward pass a batch).
  Where decoding fails this says which step of the answer was not learnt: on path-star a model
  that copies the start and the goal but follows no edge reads 100% / ≈0% … / 100%, and the
  Clever-Hans shortcut 100% / 1/d / 100% … (docs/papers/nextlat.md#rerun-authors)."""
  import jax.numpy as jnp

  p, a = prompts_BP.shape[1], answers_BA.shape[1]
  right_A = np.zeros(a)
  for i in range(0, len(prompts_BP), batch_size):
    docs = np.concatenate([prompts_BP[i:i + batch_size], answers_BA[i:i + batch_size]], axis=1)
    batch = {"tokens": jnp.asarray(docs, jnp.int32), "segment": jnp.ones(docs.shape, jnp.int32)}
    pred_BT = np.asarray(jnp.argmax(family.token_logits(params, batch), axis=-1))
    right_A += (pred_BT[:, p - 1:p - 1 + a] == docs[:, p:]).sum(axis=0)
  return [float(x) for x in right_A / len(prompts_BP)]


def score(task, family, params, prompts, answers, batch_size: int, temperature: float = 0.0,
          sample_seed: int = 0, teacher_forced: bool = True) -> dict:
  """Exact-match accuracy (and path-star's first decision) of the answers to `prompts`, greedy
  (temperature 0) or sampled, and (`teacher_forced`) the teacher-forced accuracy of each answer
  position."""
  t0 = time.time()
  outputs = _answers(family, params, prompts, task.answer_len(), batch_size, temperature, sample_seed)
  correct = np.array([task.is_correct(p, o, a) for p, o, a in zip(prompts, outputs, answers)])
  result = {"accuracy": float(correct.mean())}
  if task.name == "path_star":
    result["first_step_acc"] = float(np.mean(outputs[:, 1] == answers[:, 1]))
  if teacher_forced:
    result["teacher_forced_acc"] = teacher_forced_acc(family, params, prompts, answers, batch_size)
  result["seconds"] = round(time.time() - t0, 2)
  return result


def _header(workdir, config, task, prompts, temperature: float = 0.0, sample_seed: int = 0) -> dict:
  head = {"workdir": workdir, "task": task.name, **task.params(), "family": config.family,
          "variant": config.model.variant, "test_problems": int(len(prompts)), "temperature": float(temperature)}
  if temperature > 0.0:
    head["sample_seed"] = int(sample_seed)
  if task.name == "path_star":
    head["chance_first_step"] = 1.0 / task.d
  return head


def _write(path: str, obj: dict) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)  # a killed eval leaves the previous file, not half of one


def _check_temperature(temperature: float) -> None:
  if not (temperature >= 0.0 and np.isfinite(temperature)):
    raise NslError(f"--temperature={temperature}: must be a finite number >= 0 (0 = greedy)")


def evaluate(workdir: str, limit: int | None = None, batch_size: int = 250, data_dir: str | None = None,
             temperature: float = 0.0, sample_seed: int = 0) -> dict:
  _check_temperature(temperature)
  config, family, params = load_run(workdir)
  task, prompts, answers = load_test_set(config, limit, data_dir, workdir)
  result = {**_header(workdir, config, task, prompts, temperature, sample_seed),
            **score(task, family, params, prompts, answers, batch_size, temperature, sample_seed)}
  _write(os.path.join(workdir, f"planning{file_suffix(temperature)}.json"), result)
  return result


TRAIN_FIELDS = ("ce", "next_h", "next_h_last", "kl", "loss")  # from metrics.jsonl, where the family logs them


def train_record(workdir: str) -> dict[int, dict]:
  """step -> that metrics.jsonl line's TRAIN_FIELDS (a resumed run's repeated steps: the last)."""
  rows: dict[int, dict] = {}
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    return rows
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:  # a line cut by a kill
        continue
      if "step" in row and "ce" in row:  # training lines (eval lines carry no `ce`)
        rows[int(row["step"])] = {k: row[k] for k in TRAIN_FIELDS if k in row}
  return rows


def checkpoint_params(workdir: str, config, family, steps_done=()):
  """(step, params) of every complete checkpoint of the run not in `steps_done`, oldest first."""
  import orbax.checkpoint as ocp

  from nsl import checkpoint

  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  if not os.path.isdir(directory):
    raise NslError(f"--workdir={workdir!r}: no checkpoints directory at {directory}")
  abstract = runs.abstract_train_state(config, family)
  with checkpoint.quiet_orbax():  # no absl lines before the curve (or before an error line)
    manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True))
  try:
    for step in sorted(manager.all_steps()):
      if step not in steps_done:
        restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        yield int(step), restored["state"].params
  finally:
    manager.close()


def evaluate_curve(workdir: str, limit: int | None = None, batch_size: int = 250,
                   data_dir: str | None = None, temperature: float = 0.0, sample_seed: int = 0) -> dict:
  """Every kept checkpoint scored (see the module docstring); writes WORKDIR/planning_curve.json
  (planning_curve_T{T}.json when sampled)."""
  from nsl.models import registry

  _check_temperature(temperature)
  config = runs.load_config(workdir)
  family = registry.get_family(config)
  task, prompts, answers = load_test_set(config, limit, data_dir, workdir)
  head = _header(workdir, config, task, prompts, temperature, sample_seed)
  path = os.path.join(workdir, f"planning_curve{file_suffix(temperature)}.json")
  points: dict[int, dict] = {}
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
    if {k: old.get(k) for k in head if k != "workdir"} == {k: v for k, v in head.items() if k != "workdir"}:
      points = {int(p["step"]): p for p in old.get("points", [])}  # same test set: keep them
  record = train_record(workdir)
  for step, params in checkpoint_params(workdir, config, family, steps_done=set(points)):
    logged = [s for s in record if s <= step]
    train = dict(record[max(logged)], logged_step=max(logged)) if logged else {}
    points[step] = {"step": step, **score(task, family, params, prompts, answers, batch_size, temperature, sample_seed),
                    "train": train}
    _write(path, {**head, "points": [points[s] for s in sorted(points)]})  # a killed eval keeps the scored ones
  if not points:
    raise NslError(f"--workdir={workdir!r}: no complete checkpoint to score")
  result = {**head, "points": [points[s] for s in sorted(points)]}
  _write(path, result)
  return result


@cli_main
def main(argv=None) -> int:
  p = common.run_parser("planning", __doc__)
  # --data, --limit, --batch_size, --temperature, --sample_seed: the fields of config.evals' planning kind
  kinds.add_flags(p, kinds.Planning)
  p.add_argument("--all_checkpoints", action="store_true",
                 help="score every kept checkpoint: the learning curve in WORKDIR/planning_curve.json")
  a = p.parse_args(argv)
  kinds.check_flags(a, kinds.Planning)
  if a.all_checkpoints:
    curve = evaluate_curve(a.workdir, a.limit, a.batch_size, a.data, a.temperature, a.sample_seed)
    for point in curve["points"]:
      print(json.dumps(point))
    return 0
  print(json.dumps(evaluate(a.workdir, a.limit, a.batch_size, a.data, a.temperature, a.sample_seed)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
