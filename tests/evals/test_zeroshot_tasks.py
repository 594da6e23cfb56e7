"""Zero-shot tasks: lm-eval's own task definitions over local JSONL, with a lookup-table loglik.

The toy `loglik` knows only the exact (context, continuation) strings written here; any other
request fails the test, so the tables check that the harness's stock prompts (not a copy of them)
are what runs, and the metrics are the harness's acc / acc_norm / acc_bytes.
"""

import json
import math

import pytest

from nsl.errors import NslError
from nsl.evals.zeroshot_tasks import read_examples, score_task


def write_jsonl(path, docs):
  path.write_text("".join((d if isinstance(d, str) else json.dumps(d)) + "\n" for d in docs))
  return path


def table_loglik(table):
  """loglik from a dict {(context, continuation): loglik or (loglik, greedy)}; records calls."""
  calls = []

  def loglik(requests):
    calls.append(list(requests))
    out = []
    for req in requests:
      assert req in table, f"unexpected request {req!r}"
      v = table[req]
      out.append(v if isinstance(v, tuple) else (v, False))
    return out

  loglik.calls = calls
  return loglik


def test_arc_easy_acc_and_acc_norm_disagree(tmp_path):
  path = write_jsonl(tmp_path / "arc.jsonl", [
      {"question": "Which is a planet?", "choices": {"text": ["Mars", "the Sun", "Moon"], "label": ["A", "B", "C"]},
       "answerKey": "A"},
      # gold "elephants": lower summed loglik than "cat" (acc wrong) but higher per character (acc_norm right)
      {"question": "Which animal is largest?", "choices": {"text": ["cat", "elephants"], "label": ["1", "2"]},
       "answerKey": "2"},
  ])
  q1, q2 = "Question: Which is a planet?\nAnswer:", "Question: Which animal is largest?\nAnswer:"
  loglik = table_loglik({(q1, " Mars"): -1.0, (q1, " the Sun"): -5.0, (q1, " Moon"): -3.0,
                         (q2, " cat"): -4.0, (q2, " elephants"): -6.0})
  res = score_task(path, "arc_easy", loglik)
  assert res["n"] == 2
  assert res["acc"] == 0.5  # -4 > -6
  assert res["acc_norm"] == 1.0  # -4/3 < -6/9
  assert len(loglik.calls) == 1 and len(loglik.calls[0]) == 5  # one batched call


def test_acc_norm_counts_choice_characters_acc_bytes_counts_choice_bytes(tmp_path):
  path = write_jsonl(tmp_path / "piqa.jsonl", [{"goal": "Open a jar", "sol1": "\u00e9\u00e9", "sol2": "abc", "label": 1}])
  ctx = "Question: Open a jar\nAnswer:"
  res = score_task(path, "piqa", table_loglik({(ctx, " \u00e9\u00e9"): -2.0, (ctx, " abc"): -2.7}))
  assert res["acc"] == 0.0  # -2.0 > -2.7
  assert res["acc_norm"] == 1.0  # per character: -2/2 = -1.0 < -2.7/3 = -0.9
  assert res["acc_bytes"] == 0.0  # per UTF-8 byte of the choice: -2/4 = -0.5 > -0.9
  assert res["acc_stderr"] is None  # one example


def test_hellaswag_runs_the_harness_preprocessing(tmp_path):
  path = write_jsonl(tmp_path / "hs.jsonl", [
      {"activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
       "endings": ["is using wrap to wrap a pair of skis.", "starts pulling up roofing on a roof. [step]"], "label": "1"},
      {"activity_label": "Cleaning", "ctx_a": " How to clean [title] Use soap.", "ctx_b": "then rinse [step] ",
       "endings": ["It barks.", "It sings opera [title] loudly."], "label": "0"},
  ])
  c1 = "Roof shingle removal: A man is sitting on a roof. He"
  # strip comes first, so removing a trailing "[step]" leaves its space (as in the harness)
  c2 = "Cleaning: How to clean. Use soap. Then rinse "
  loglik = table_loglik({(c1, " is using wrap to wrap a pair of skis."): -9.0,
                         (c1, " starts pulling up roofing on a roof. "): -7.0,
                         (c2, " It barks."): -2.0, (c2, " It sings opera. loudly."): -8.0})
  res = score_task(path, "hellaswag", loglik)
  assert res["acc"] == 1.0 and res["acc_norm"] == 1.0 and res["n"] == 2


def test_sciq_context_and_gold_index_three(tmp_path):
  path = write_jsonl(tmp_path / "sciq.jsonl", [{
      "question": "What grows best at moderate temperatures?", "distractor1": "thermophiles",
      "distractor2": "psychrophiles", "distractor3": "cryophiles", "correct_answer": "mesophiles",
      "support": "\n  Mesophiles grow best in moderate temperature."}])
  assert read_examples(path, "sciq")[0]["correct_answer"] == "mesophiles"
  ctx = "Mesophiles grow best in moderate temperature.\nQuestion: What grows best at moderate temperatures?\nAnswer:"
  loglik = table_loglik({(ctx, " thermophiles"): -5.0, (ctx, " psychrophiles"): -6.0,
                         (ctx, " cryophiles"): -7.0, (ctx, " mesophiles"): -1.0})
  assert score_task(path, "sciq", loglik)["acc"] == 1.0  # the harness puts the correct answer last: gold 3


def test_lambada_greedy_accuracy_and_mean_loglik(tmp_path):
  path = write_jsonl(tmp_path / "lambada.jsonl", [{"text": "the cat sat on the mat"}, {"text": "she said hello"}])
  loglik = table_loglik({("the cat sat on the", " mat"): (-0.5, True), ("she said", " hello"): (-3.5, False)})
  res = score_task(path, "lambada", loglik)
  assert res == {"task": "lambada", "n": 2, "acc": 0.5, "acc_stderr": pytest.approx(0.5), "mean_loglik": -2.0,
                 "perplexity": pytest.approx(math.exp(2.0))}


def test_limit_reads_only_the_first_examples(tmp_path):
  path = write_jsonl(tmp_path / "lambada.jsonl", [{"text": "a b"}, {"text": "c d"}, "not json"])
  res = score_task(path, "lambada", table_loglik({("a", " b"): (-1.0, True)}), limit=1)
  assert res["n"] == 1 and res["acc"] == 1.0


@pytest.mark.parametrize("task,docs,line,message", [
    ("piqa", [{"goal": "g", "sol1": "a", "sol2": "b", "label": 0}, "{not json"], 2, "bad JSON"),
    ("piqa", [{"goal": "g", "sol1": "a", "label": 0}], 1, "missing field 'sol2'"),
    ("piqa", [{"goal": "g", "sol1": "a", "sol2": "b", "label": 0}, "", {"goal": "g", "sol1": "a", "sol2": "b", "label": 2}],
     3, "not an index"),
    ("hellaswag", [{"activity_label": "a", "ctx_a": "c", "ctx_b": "d", "endings": ["x", "y"], "label": 2}], 1,
     "not an index"),
    ("arc_easy", [{"question": "q", "choices": {"text": ["x"], "label": ["A"]}, "answerKey": "B"}], 1, "answerKey 'B'"),
    ("lambada", [{"text": "oneword"}], 1, "last word"),
    ("sciq", [{"question": "q"}], 1, "missing field 'support'"),
])
def test_malformed_line_names_file_and_line(tmp_path, task, docs, line, message):
  path = write_jsonl(tmp_path / f"{task}.jsonl", docs)
  with pytest.raises(NslError, match=rf"{path.name}:{line}: .*{message}"):
    score_task(path, task, table_loglik({}))


def test_unknown_task_and_missing_file(tmp_path):
  with pytest.raises(NslError, match="unknown zero-shot task"):
    score_task(tmp_path / "x.jsonl", "winogrande", table_loglik({}))
  with pytest.raises(NslError, match="no such task file"):
    score_task(tmp_path / "x.jsonl", "piqa", table_loglik({}))
