"""lm-evaluation-harness on a tiny trained run: the local task of tests/evals/data through the harness
equals nsl's own per-token scoring item by item; rolling log-likelihood and generation against
direct computations; the command line's unknown task."""

import json
import os
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from nsl.evals import common, lm_eval_model, lm_eval as lm_eval_cli, zeroshot

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join("tests", "evals", "data")  # the YAML's data_files are relative to the repository root


@pytest.fixture(scope="module")
def run(tiny_byte_run):
  """The tiny trained run of tests/evals/conftest.py (standard family, byte tokens, seq_len 64)
  as lm-eval's model, on the tests' 8 fake devices."""
  workdir = tiny_byte_run[0]
  return workdir, lm_eval_model.NslLM(run=workdir, batch_size=4)


def direct_logliks(lm, pairs):
  """nsl's own scoring, one request at a time: `nsl.evals.common.token_nll` (the NLL evaluator's
  per-target NLL) of a single-row batch, summed over the continuation's targets. A request is
  (context, continuation) strings, tokenized by the harness's rule, or token lists."""
  params = jax.device_get(lm.params)
  nll_fn = jax.jit(lambda p, b: common.token_nll(lm.family, p, b)[0])
  out = []
  for ctx, cont in pairs:
    ctx_ids, cont_ids = (zeroshot.encode_pair(lm.tokenizer, ctx, cont, lm.eot_token_id) if isinstance(ctx, str)
                         else (ctx, cont))
    whole = (ctx_ids + cont_ids)[-(lm.seq_len + 1):]
    tok = np.full((1, lm.seq_len + 1), lm.eot_token_id, np.int32)
    seg = np.zeros_like(tok)
    tok[0, :len(whole)], seg[0, :len(whole)] = whole, 1
    nll = np.asarray(nll_fn(params, {"tokens": tok, "segment": seg}))[0]
    out.append(-float(nll[len(whole) - 1 - len(cont_ids):len(whole) - 1].sum()))
  return out


def test_local_task_through_the_harness_equals_nsls_scorer_item_by_item(run, monkeypatch):
  from lm_eval import evaluator
  from lm_eval.tasks import TaskManager

  _, lm = run
  monkeypatch.chdir(ROOT)
  tasks = TaskManager(include_path=DATA, include_defaults=False).load(["nsl_tiny_mc"])
  out = evaluator.evaluate(lm, tasks, log_samples=True, bootstrap_iters=0, verbosity="WARNING")
  samples = sorted(out["samples"]["nsl_tiny_mc"], key=lambda s: s["doc_id"])
  with open(os.path.join(DATA, "tiny_mc.jsonl")) as f:
    docs = [json.loads(line) for line in f]
  assert len(samples) == len(docs) == 10
  # the file has an empty context, a trailing space and one longer than seq_len
  assert "" in [d["question"] for d in docs] and max(len(d["question"]) for d in docs) > 2 * lm.seq_len
  accs = []
  for doc, sample in zip(docs, samples):
    lls = direct_logliks(lm, [(doc["question"], " " + c) for c in doc["choices"]])
    harness = [float(r[0]) for r in sample["filtered_resps"]]
    np.testing.assert_allclose(harness, lls, rtol=0, atol=2e-4)
    assert sample["acc"] == float(np.argmax(lls) == doc["label"]), doc
    norm = np.array(lls) / np.array([len(c) for c in doc["choices"]])
    assert sample["acc_norm"] == float(np.argmax(norm) == doc["label"]), doc
    accs.append(sample["acc"])
  assert out["results"]["nsl_tiny_mc"]["acc,none"] == pytest.approx(np.mean(accs))
  # the same run through zeroshot's callable (`make_loglik` is this model) gives the same numbers
  pairs = [(docs[0]["question"], " " + c) for c in docs[0]["choices"]]
  assert [ll for ll, _ in lm(pairs)] == [float(r[0]) for r in samples[0]["filtered_resps"]]


def test_rolling_loglikelihood_sums_the_harness_windows(run):
  _, lm = run
  text = "The union is strong, and the state of our nation is sound. " * 3
  ids = lm.tok_encode(text)
  assert len(ids) == 177  # byte tokens, over two rows of seq_len 64
  (got,) = lm.loglikelihood_rolling([SimpleNamespace(args=(text,))])
  # the harness's disjoint windows for 177 tokens at seq_len 64: EOS + tokens 0..62 predict 0..63,
  # then token 63 (context) predicts 64..127, then 112..127 (context) predict 128..176
  pieces = [([lm.eot_token_id], ids[:64]), (ids[:64], ids[64:128]), (ids[:128], ids[128:])]
  expect = direct_logliks(lm, pieces)  # a context longer than the row is cut from the left
  assert got == pytest.approx(sum(expect), abs=5e-4)


def test_generate_until_decodes_greedily_and_stops(run, monkeypatch):
  _, lm = run
  # the decoder of families without a cached one (SED): one compile of token_logits, where the
  # cached decoder (tests/test_decode.py checks it equals this recomputation) costs ~15 s more here
  monkeypatch.setattr(lm.family, "decoder", lambda: None)
  prompt = "Fellow citizens of the Senate and House of Representatives: the state of the"
  (text,) = lm.generate_until([SimpleNamespace(args=(prompt, {"until": ["\x00never"], "max_gen_toks": 12}))])
  assert len(lm.tok_encode(text)) == 12
  seen = prompt[-(lm.seq_len - 12):]  # the context left-truncated to seq_len - max_gen_toks tokens
  assert lm([(seen, text)])[0][1]  # every generated token is the argmax after its prefix
  junk = SimpleNamespace(args=("Anything before it. " * 5 + prompt, {"until": ["\x00never"], "max_gen_toks": 12}))
  assert lm.generate_until([junk]) == [text]  # the same 52 tokens of context
  # sampled at T = 1 (reproducible per seed): a stop sequence inside the text cuts it there
  sampled = {"until": ["\x00never"], "max_gen_toks": 12, "do_sample": True, "temperature": 1.0}
  (free,) = lm.generate_until([SimpleNamespace(args=(prompt, sampled))])
  stop = free[6:8]
  (cut,) = lm.generate_until([SimpleNamespace(args=(prompt, dict(sampled, until=[stop])))])
  assert cut == free[:free.index(stop)] and len(free) > len(cut), (free, cut)
  # ids past the tokenizer (padding rows of the embedding, SPS's <predict>) decode to nothing
  assert lm.tok_decode([72, 105, 300, 256]) == "Hi<|endoftext|>"
  with pytest.raises(lm_eval_model.NslError, match="max_gen_toks=64 leaves no room"):
    lm.generate_until([SimpleNamespace(args=(prompt, {"until": [], "max_gen_toks": 64}))])


def test_the_command_registers_nsl_and_an_unknown_task_is_one_line_exit_2(run, monkeypatch, capsys):
  workdir, _ = run
  monkeypatch.chdir(ROOT)
  argv = ["--local_only", "--include_path", DATA, "--model_args", f"run={workdir}", "--tasks"]
  assert lm_eval_cli.main(argv + ["nsl_no_such_task"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "Tasks not found: nsl_no_such_task" in err[0], err
  from lm_eval.api.registry import get_model

  assert get_model("nsl") is lm_eval_model.NslLM
  assert lm_eval_cli.main(["--local_only", "--tasks", "nsl_tiny_mc"]) == 2
  assert "--local_only needs --include_path" in capsys.readouterr().err
