"""Zero-shot task scores of a trained run: `python -m nsl.evals.zeroshot`.

  python -m nsl.evals.zeroshot --workdir=RUN --task=arc_easy=PATH.jsonl [--task=lambada=PATH ...]
                               [--limit=N] [--batch_size=16]

Everything runs through lm-evaluation-harness (the `[lmeval]` extra): the tasks (arc_easy,
hellaswag, piqa, sciq, lambada) are lm-eval's own definitions over local JSONL
(`nsl.evals.zeroshot_tasks`), and the run is lm-eval's model `nsl.evals.lm_eval_model.NslLM`, which
tokenizes as the harness does, left-truncates rows to the run's seq_len and scores them with the
family's `token_logits` (`make_scorer`) `--batch_size` rows at a time
(docs/guide/evaluation.md#lm-eval-harness). The same model serves `lm_eval --model nsl` for any
other task (`python -m nsl.evals.lm_eval`).
Scores merge into RUN/result.json under `zeroshot` (atomically) and print as one JSON object.
"""

from __future__ import annotations

import json
import os
import sys

from nsl.errors import NslError, cli_main
from nsl.evals import common, kinds, zeroshot_tasks
from nsl.evals.nll import check_workdir, merge_result


def encode_pair(tokenizer, context: str, continuation: str, eos_id: int) -> tuple[list[int], list[int]]:
  """Context and continuation token ids as lm-evaluation-harness's `TemplateLM.loglikelihood`
  makes them (which `NslLM` inherits); a reference for tests and readers."""
  n_spaces = len(context) - len(context.rstrip())
  if n_spaces:
    context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
  if not context:
    return [eos_id], list(tokenizer.encode(continuation))
  whole = list(tokenizer.encode(context + continuation))
  context_ids = list(tokenizer.encode(context))
  return context_ids, whole[len(context_ids):]


def make_loglik(family, params, config, tokenizer, eos_id: int, batch_size: int = 16, scorer=None):
  """The run as lm-eval's model (`NslLM`), callable as the `loglik(requests) -> [(summed logprob,
  all greedy)]` of `score_task` (`scorer`: a `make_scorer` of this family to reuse; default a new one)."""
  zeroshot_tasks.require_lm_eval()
  from nsl.evals.lm_eval_model import NslLM

  return NslLM(config=config, family=family, params=params, tokenizer=tokenizer, eos_id=eos_id,
               batch_size=batch_size, scorer=scorer)


def score_tasks(loglik, tasks: list[tuple[str, str]], limit: int | None) -> dict[str, dict]:
  """{task: its `score_task` metrics, path and limit} of every (task, JSONL path) under `loglik`:
  this command's and the trainer's zeroshot evaluator's scores."""
  scores = {}
  for task, path in tasks:
    score = zeroshot_tasks.score_task(path, task, loglik, limit)
    scores[task] = dict(score, path=os.path.abspath(path), limit=limit)
  return scores


def _parse_task(spec: str) -> tuple[str, str]:
  task, sep, path = spec.partition("=")
  if not sep or not path:
    raise NslError(f"--task={spec!r}: expected TASK=PATH.jsonl with TASK one of {sorted(zeroshot_tasks.READERS)}")
  if task not in zeroshot_tasks.READERS:
    raise NslError(f"--task={spec!r}: unknown task {task!r}; known: {sorted(zeroshot_tasks.READERS)}")
  if not os.path.isfile(path):
    raise NslError(f"--task={spec!r}: no such task file {path}")
  return task, path


@cli_main
def main(argv: list[str] | None = None) -> int:
  p = common.run_parser("zeroshot", __doc__)
  p.add_argument("--task", action="append", required=True,
                 help=f"TASK=PATH.jsonl, TASK one of {sorted(zeroshot_tasks.READERS)} (repeatable)")
  kinds.add_flags(p, kinds.Zeroshot)  # --limit, --batch_size: the fields of config.evals' zeroshot kind
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  kinds.check_flags(args, kinds.Zeroshot)
  tasks = [_parse_task(t) for t in args.task]
  for task, path in tasks:  # malformed files fail before the model loads
    zeroshot_tasks.read_examples(path, task, args.limit)
  zeroshot_tasks.require_lm_eval()
  import ml_collections

  from nsl.data import rundata
  from nsl.evals.nll import _load_run

  # the run's own tokenizer (RUN/tokenizer, else its data dir's), before the model loads
  tokenizer, eos_id, _ = rundata.tokenizer(args.workdir, ml_collections.ConfigDict(check_workdir(args.workdir)))
  config, family, params = _load_run(args.workdir)
  loglik = make_loglik(family, params, config, tokenizer, eos_id, args.batch_size)
  scores = score_tasks(loglik, tasks, args.limit)
  merge_result(args.workdir, "zeroshot", scores)
  print(json.dumps({"zeroshot": scores}, sort_keys=True))
  return 0


if __name__ == "__main__":  # run the imported module, so its warnings are not attributed to __main__
  from nsl.evals.zeroshot import main as _main

  sys.exit(_main())
