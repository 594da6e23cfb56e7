"""Zero-shot tasks, the model-independent half: JSONL readers, prompts, scoring.

Prompts and metrics follow EleutherAI's lm-evaluation-harness so numbers are comparable:

  arc_easy   context "Question: {question}\\nAnswer:", choices choices.text, gold = index of
             answerKey in choices.label.
  hellaswag  context preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())
             (just `ctx` when ctx_a/ctx_b are absent; no "label: " prefix without
             activity_label), choices preprocess(ending); preprocess = strip, " [title]" -> ". ",
             drop "[...]", "  " -> " ".
  piqa       context "Question: {goal}\\nAnswer:", choices (sol1, sol2), gold = label.
  sciq       context "{support.lstrip()}\\nQuestion: {question}\\nAnswer:", choices
             (distractor1, distractor2, distractor3, correct_answer): gold is always 3.
  lambada    context = text.split(" ")[:-1] joined by " ", continuation " " + last word.

A multiple-choice request is (context, " " + choice) (the harness's target delimiter). Metrics:
  acc        mean of [argmax_i loglik_i == gold];
  acc_norm   mean of [argmax_i loglik_i / len(choice_i) == gold], len in characters of the choice
             without the delimiter, exactly as the harness's `completion_len`;
  acc_bytes  the same normalised by UTF-8 bytes of the continuation (" " + choice); it can rank
             differently from acc_norm (it counts the delimiter and multi-byte characters);
  lambada    acc = mean of [every continuation token is the greedy argmax], mean_loglik.
Ties in argmax go to the lowest index (numpy argmax), as in the harness. `*_stderr` is the
sample standard deviation over examples / sqrt(n), as the harness reports.

`score_task(path, task, loglik)` is the whole interface: `loglik` gets every request of the file
in one list (so a caller can batch and sort by length) and returns, per request, the summed
log-probability of the continuation tokens given the context and whether all of them are greedy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from nsl.errors import NslError

Request = tuple[str, str]
LoglikFn = Callable[[list[Request]], Sequence[tuple[float, bool]]]
TARGET_DELIMITER = " "


@dataclasses.dataclass(frozen=True)
class Example:
  """One task example: a context, the candidate continuations and (multiple choice) the gold index."""

  context: str
  choices: tuple[str, ...]  # choice texts without the delimiter (lambada: the last word)
  gold: int | None  # None for lambada (a single continuation)
  line: int  # 1-based line in the source file

  @property
  def requests(self) -> list[Request]:
    return [(self.context, TARGET_DELIMITER + c) for c in self.choices]


class _Malformed(Exception):
  """A bad field in one line; `read_examples` turns it into NslError with file:line."""


def _field(doc: dict, name: str, kind=str):
  if name not in doc:
    raise _Malformed(f"missing field {name!r}")
  value = doc[name]
  if kind is str and not isinstance(value, str):
    raise _Malformed(f"field {name!r} must be a string, got {type(value).__name__}")
  return value


def _gold(value, n: int, name: str) -> int:
  """An integer label (int or digit string, as HF datasets store them) within [0, n)."""
  is_digits = isinstance(value, str) and value.strip().isdigit()
  if isinstance(value, bool) or not (isinstance(value, int) or is_digits):
    raise _Malformed(f"field {name!r} must be an integer index, got {value!r}")
  gold = int(value)
  if not 0 <= gold < n:
    raise _Malformed(f"field {name!r} = {gold} is out of range for {n} choices")
  return gold


def _strings(value, name: str) -> tuple[str, ...]:
  if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
    raise _Malformed(f"field {name!r} must be a non-empty list of strings")
  return tuple(value)


def hellaswag_preprocess(text: str) -> str:
  """The harness's HellaSwag cleanup (WikiHow artifacts): strip, " [title]" -> ". ", drop
  bracketed text, collapse one level of double spaces."""
  text = text.strip()
  text = text.replace(" [title]", ". ")
  text = re.sub("\\[.*?\\]", "", text)
  return text.replace("  ", " ")


def _arc(doc, line):
  choices = _field(doc, "choices", dict)
  if not isinstance(choices, dict):
    raise _Malformed("field 'choices' must be an object with 'text' and 'label'")
  texts = _strings(choices.get("text"), "choices.text")
  labels = _strings(choices.get("label"), "choices.label")
  if len(texts) != len(labels):
    raise _Malformed(f"choices.text has {len(texts)} entries but choices.label has {len(labels)}")
  key = _field(doc, "answerKey")
  if key not in labels:
    raise _Malformed(f"answerKey {key!r} is not one of choices.label {list(labels)}")
  return Example(f"Question: {_field(doc, 'question')}\nAnswer:", texts, labels.index(key), line)


def _hellaswag(doc, line):
  if "ctx_a" in doc and "ctx_b" in doc:
    ctx = _field(doc, "ctx_a") + " " + _field(doc, "ctx_b").capitalize()
  else:
    ctx = _field(doc, "ctx")
  if "activity_label" in doc:
    ctx = _field(doc, "activity_label") + ": " + ctx
  endings = tuple(hellaswag_preprocess(e) for e in _strings(_field(doc, "endings", list), "endings"))
  gold = _gold(_field(doc, "label", None), len(endings), "label")
  return Example(hellaswag_preprocess(ctx), endings, gold, line)


def _piqa(doc, line):
  choices = (_field(doc, "sol1"), _field(doc, "sol2"))
  gold = _gold(_field(doc, "label", None), 2, "label")
  return Example(f"Question: {_field(doc, 'goal')}\nAnswer:", choices, gold, line)


def _sciq(doc, line):
  context = f"{_field(doc, 'support').lstrip()}\nQuestion: {_field(doc, 'question')}\nAnswer:"
  # the harness always puts the correct answer last: gold index 3
  choices = tuple(_field(doc, k) for k in ("distractor1", "distractor2", "distractor3",
                                           "correct_answer"))
  return Example(context, choices, 3, line)


def _lambada(doc, line):
  words = _field(doc, "text").split(" ")
  if len(words) < 2 or not words[-1]:
    raise _Malformed("field 'text' needs a context and a last word separated by a space")
  return Example(" ".join(words[:-1]), (words[-1],), None, line)


READERS = {"arc_easy": _arc, "hellaswag": _hellaswag, "piqa": _piqa, "sciq": _sciq, "lambada": _lambada}


def read_examples(path: str | Path, task: str, limit: int | None = None) -> list[Example]:
  """Parses a JSONL task file (blank lines skipped); the first `limit` examples when given.
  Malformed lines raise NslError naming file:line."""
  if task not in READERS:
    raise NslError(f"unknown zero-shot task {task!r}; known: {sorted(READERS)}")
  if limit is not None and limit < 1:
    raise NslError(f"limit={limit}: must be >= 1 (or None for every example)")
  path = Path(path)
  if not path.is_file():
    raise NslError(f"{path}: no such task file")
  examples = []
  with open(path, encoding="utf-8") as f:
    for lineno, text in enumerate(f, start=1):
      if limit is not None and len(examples) >= limit:
        break
      if not text.strip():
        continue
      try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
          raise _Malformed("expected a JSON object")
        examples.append(READERS[task](doc, lineno))
      except json.JSONDecodeError as e:
        raise NslError(f"{path}:{lineno}: bad JSON ({e.msg}) in {task} file") from None
      except _Malformed as e:
        raise NslError(f"{path}:{lineno}: {e} ({task} format)") from None
  if not examples:
    raise NslError(f"{path}: no examples in {task} file")
  return examples


def _mean_stderr(values) -> tuple[float, float]:
  v = np.asarray(values, dtype=float)
  stderr = float(np.std(v, ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
  return float(v.mean()), stderr


def score_examples(examples: Sequence[Example], loglik: LoglikFn, task: str) -> dict:
  """Runs every request through `loglik` in one call and aggregates the metrics."""
  requests = [req for ex in examples for req in ex.requests]
  results = list(loglik(requests))
  if len(results) != len(requests):
    raise ValueError(f"loglik returned {len(results)} results for {len(requests)} requests")
  out: dict = {"task": task, "n": len(examples)}
  if task == "lambada":
    lls = [float(r[0]) for r in results]
    out["acc"], out["acc_stderr"] = _mean_stderr([bool(r[1]) for r in results])
    out["mean_loglik"] = float(np.mean(lls))
    return out
  acc, acc_norm, acc_bytes, i = [], [], [], 0
  for ex in examples:
    lls = np.array([float(r[0]) for r in results[i:i + len(ex.choices)]])
    i += len(ex.choices)
    chars = np.array([len(c) for c in ex.choices], dtype=float)
    nbytes = np.array([len((TARGET_DELIMITER + c).encode("utf-8")) for c in ex.choices], dtype=float)
    acc.append(int(np.argmax(lls)) == ex.gold)
    # an empty choice divides by zero and scores ±inf, as in the harness
    with np.errstate(divide="ignore", invalid="ignore"):
      acc_norm.append(int(np.argmax(lls / chars)) == ex.gold)
    acc_bytes.append(int(np.argmax(lls / nbytes)) == ex.gold)
  for name, values in (("acc", acc), ("acc_norm", acc_norm), ("acc_bytes", acc_bytes)):
    out[name], out[f"{name}_stderr"] = _mean_stderr(values)
  return out


def score_task(path: str | Path, task: str, loglik: LoglikFn, limit: int | None = None) -> dict:
  """Reads `path` as task `task` (arc_easy, hellaswag, piqa, sciq, lambada) and scores it.

  Returns {"task", "n", "acc", "acc_stderr", and for multiple choice "acc_norm", "acc_bytes"
  (+ stderr); for lambada "mean_loglik"}.
  """
  return score_examples(read_examples(path, task, limit), loglik, task)
