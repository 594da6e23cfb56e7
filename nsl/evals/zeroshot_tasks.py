"""Zero-shot tasks over local JSONL, scored by lm-evaluation-harness's own task definitions.

The SPS paper's suite is lm-eval's `arc_easy`, `hellaswag`, `piqa`, `sciq` and `lambada_openai`
(`lambada` here). Those tasks read their data from the Hugging Face hub; here each one's stock
definition (its YAML in the installed lm-eval: prompt, choices, gold, metrics, hellaswag's
preprocessing) is loaded as it is and only its data source is swapped for the records of a local
JSONL file, so prompts cannot drift from the harness's
(docs/guide/evaluation.md#lm-eval-harness). A JSONL line is one record of the hub dataset with the
fields the task reads (`FIELDS`); `read_examples` checks them (a malformed file is one line naming
file:line) and the checked records are the harness's test split.

`score_task(path, task, model)` runs the harness's `evaluate` on the task with `model`, an lm-eval
LM (`nsl.evals.lm_eval_model.NslLM`) or a plain `loglik(requests) -> [(summed logprob, greedy)]`
over (context, continuation) strings, and returns the harness's metrics: multiple choice `acc`,
`acc_norm` (log-likelihood over the choice's characters), `acc_bytes` (over its UTF-8 bytes);
lambada `acc` (every continuation token greedy), `perplexity` and `mean_loglik`; each with its
`*_stderr` as the harness computes it.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Sequence

from nsl.errors import NslError

Request = tuple[str, str]
LoglikFn = Callable[[list[Request]], Sequence[tuple[float, bool]]]

# nsl's task name -> lm-eval's task, its YAML under lm_eval/tasks/, the record fields it reads
TASKS = {
    "arc_easy": ("arc_easy", "arc/arc_easy.yaml"),
    "hellaswag": ("hellaswag", "hellaswag/hellaswag.yaml"),
    "piqa": ("piqa", "piqa/piqa.yaml"),
    "sciq": ("sciq", "sciq/sciq.yaml"),
    "lambada": ("lambada_openai", "lambada/lambada_openai.yaml"),
}
FIELDS = {
    "arc_easy": {"question": str, "choices": dict, "answerKey": str},
    "hellaswag": {"activity_label": str, "ctx_a": str, "ctx_b": str, "endings": list, "label": (str, int)},
    "piqa": {"goal": str, "sol1": str, "sol2": str, "label": int},
    "sciq": {"support": str, "question": str, "distractor1": str, "distractor2": str, "distractor3": str,
             "correct_answer": str},
    "lambada": {"text": str},
}
READERS = TASKS  # the task names `nsl.evals.specs` validates against
MC_METRICS = ("acc", "acc_norm", "acc_bytes")


def require_lm_eval():
  try:
    import lm_eval  # noqa: F401
  except ImportError:
    raise NslError("zero-shot scoring runs through lm-evaluation-harness, which is not installed: "
                   "pip install -e '.[lmeval]'") from None


def _check(doc: dict, task: str) -> None:
  for name, kind in FIELDS[task].items():
    if name not in doc:
      raise ValueError(f"missing field {name!r}")
    if not isinstance(doc[name], kind) or isinstance(doc[name], bool):
      raise ValueError(f"field {name!r} has type {type(doc[name]).__name__}")
  if task == "arc_easy":
    labels, texts = doc["choices"].get("label"), doc["choices"].get("text")
    if not isinstance(labels, list) or not isinstance(texts, list) or len(labels) != len(texts) or not texts:
      raise ValueError("field 'choices' needs lists 'text' and 'label' of one length")
    if doc["answerKey"] not in labels:
      raise ValueError(f"answerKey {doc['answerKey']!r} is not one of choices.label {labels}")
  if task in ("hellaswag", "piqa"):
    n = len(doc["endings"]) if task == "hellaswag" else 2
    if not str(doc["label"]).strip().isdigit() or not 0 <= int(doc["label"]) < n:
      raise ValueError(f"field 'label' = {doc['label']!r} is not an index of the {n} choices")
  if task == "lambada" and len(doc["text"].split(" ")) < 2:
    raise ValueError("field 'text' needs a context and a last word separated by a space")


def read_examples(path: str | Path, task: str, limit: int | None = None) -> list[dict]:
  """The records of a JSONL task file (blank lines skipped; the first `limit` when given), each
  checked for the fields its lm-eval task reads. Malformed lines raise NslError naming file:line."""
  if task not in TASKS:
    raise NslError(f"unknown zero-shot task {task!r}; known: {sorted(TASKS)}")
  if limit is not None and limit < 1:
    raise NslError(f"limit={limit}: must be >= 1 (or None for every example)")
  path = Path(path)
  if not path.is_file():
    raise NslError(f"{path}: no such task file")
  docs = []
  with open(path, encoding="utf-8") as f:
    for lineno, text in enumerate(f, start=1):
      if limit is not None and len(docs) >= limit:
        break
      if not text.strip():
        continue
      try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
          raise ValueError("expected a JSON object")
        _check(doc, task)
      except json.JSONDecodeError as e:
        raise NslError(f"{path}:{lineno}: bad JSON ({e.msg}) in {task} file") from None
      except ValueError as e:
        raise NslError(f"{path}:{lineno}: {e} ({task} format, as lm-eval's {TASKS[task][0]} reads it)") from None
      docs.append(doc)
  if not docs:
    raise NslError(f"{path}: no examples in {task} file")
  return docs


def task_config(task: str, path: str | Path, docs: list[dict]) -> dict[str, Any]:
  """lm-eval's stock config of `task` with `docs` (read from the local JSONL `path`) as its test
  split, handed over as lm-eval's `custom_dataset` (so the harness reads what was checked)."""
  import datasets
  import lm_eval.tasks
  from lm_eval.tasks._yaml_loader import load_yaml

  name, yaml_file = TASKS[task]
  cfg = load_yaml(Path(lm_eval.tasks.__file__).parent / yaml_file, resolve_func=True)
  cfg.update(task=f"nsl_{name}", dataset_path=str(Path(path).resolve()), dataset_name=None, dataset_kwargs=None,
             custom_dataset=lambda **_: datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)}),
             training_split=None, validation_split=None, test_split="test", fewshot_split=None)
  cfg.pop("tag", None)
  if cfg["output_type"] == "multiple_choice":
    cfg["metric_list"] = [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in MC_METRICS]
  return cfg


class _NoCustomDatasetHint(logging.Filter):
  """Drops the harness's advice on passing kwargs to a custom dataset (nsl passes none)."""

  def filter(self, record):
    return "Custom kwargs can be passed" not in record.getMessage()


def _as_lm(model):
  """An lm-eval LM: `model` itself, or a plain loglik callable behind the harness's interface."""
  from lm_eval.api.model import LM

  if isinstance(model, LM):
    return model

  class LoglikLM(LM):
    def loglikelihood(self, requests, disable_tqdm: bool = False):
      return [tuple(r) for r in model([tuple(req.args) for req in requests])]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
      raise NotImplementedError("the zero-shot tasks make no rolling requests")

    def generate_until(self, requests, disable_tqdm: bool = False):
      raise NotImplementedError("the zero-shot tasks make no generation requests")

  return LoglikLM()


def evaluate(model, task_configs: list[dict], limit: int | None = None) -> dict:
  """The harness's `evaluate` of `model` on task configs: {"results": ..., "samples": ...}. The
  harness's INFO logs and progress bars stay quiet (warnings still show)."""
  from lm_eval import evaluator
  from lm_eval.tasks import TaskManager

  logger, hint = logging.getLogger("lm_eval"), _NoCustomDatasetHint()
  level, logger.level = logger.level, logging.WARNING
  logging.getLogger("lm_eval.api.task").addFilter(hint)
  # the harness bootstraps perplexity's stderr in a forked process pool unless told not to: a
  # fork of a process running JAX's threads (the trainer's) can deadlock
  multiproc = os.environ.get("DISABLE_MULTIPROC")
  os.environ["DISABLE_MULTIPROC"] = "1"
  try:
    tasks = TaskManager(include_defaults=False).load(task_configs)
    # stderr of a mean is closed-form; the 100 bootstrap draws are for perplexity's
    return evaluator.evaluate(_as_lm(model), tasks, limit=limit, bootstrap_iters=100, log_samples=True,
                              verbosity="WARNING")
  finally:
    logger.level = level
    logging.getLogger("lm_eval.api.task").removeFilter(hint)
    if multiproc is None:
      del os.environ["DISABLE_MULTIPROC"]
    else:
      os.environ["DISABLE_MULTIPROC"] = multiproc


def _finite(x):
  return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def score_task(path: str | Path, task: str, model: LoglikFn | Any, limit: int | None = None) -> dict:
  """Scores the JSONL `path` as `task` (arc_easy, hellaswag, piqa, sciq, lambada) with `model`.

  Returns {"task", "n", "acc", "acc_stderr", and for multiple choice "acc_norm", "acc_bytes"
  (+ stderr); for lambada "perplexity" and "mean_loglik"}; a stderr of one example is None.
  """
  docs = read_examples(path, task, limit)
  require_lm_eval()
  out = evaluate(model, [task_config(task, path, docs)])
  name = f"nsl_{TASKS[task][0]}"
  metrics = out["results"][name]
  score: dict = {"task": task, "n": len(out["samples"][name])}
  for metric in (("acc", "perplexity") if task == "lambada" else MC_METRICS):
    score[metric] = _finite(metrics[f"{metric},none"])
    score[f"{metric}_stderr"] = _finite(metrics.get(f"{metric}_stderr,none"))
  if task == "lambada":
    del score["perplexity_stderr"]
    score["mean_loglik"] = sum(s["perplexity"] for s in out["samples"][name]) / score["n"]
  return score
