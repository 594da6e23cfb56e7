"""nsl.evals.nll and nsl.evals.zeroshot on a tiny trained run."""

import json
import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nsl.data import prepare, tokenizers
from nsl.evals import nll, zeroshot
from tests.helpers import run_cli

ARC = [
    {"question": "Which word is common?", "choices": {"text": ["the", "zqxj"], "label": ["A", "B"]}, "answerKey": "A"},
    {"question": "Pick one", "choices": {"text": ["and", "of the", "\u0001\u0002"], "label": ["1", "2", "3"]},
     "answerKey": "1"},
    {"question": "A long one " + "with many words " * 12, "choices": {"text": ["yes", "no"], "label": ["A", "B"]},
     "answerKey": "B"},
]


@pytest.fixture(scope="module")
def run(tiny_byte_run):
  """(workdir, data, config) of the tiny trained run in tests/evals/conftest.py."""
  return tiny_byte_run


def _result(workdir):
  with open(os.path.join(workdir, "result.json")) as f:
    return json.load(f)


def test_nll_matches_the_trainers_final_eval_and_scores_other_sets(run, tmp_path, capsys):
  workdir, data, config = run
  trainer_val = _result(workdir)["eval"]["val"]
  assert nll.main([f"--workdir={workdir}", f"--max_batches={config.train.eval_batches}"]) == 0
  printed = json.loads(capsys.readouterr().out)
  assert abs(printed["eval"]["val"] - trainer_val) < 1e-5
  # bits per byte beside nats per token, with the bytes and targets it was measured on
  d = printed["eval_details"]["val"]
  assert d["bytes"] > 0 and d["bytes_per_token"] == d["bytes"] / d["byte_targets"]
  assert printed["eval_bits_per_byte"]["val"] == d["bits_per_byte"] == \
      pytest.approx(printed["eval"]["val"] / math.log(2) / d["bytes_per_token"])
  assert _result(workdir)["eval_bits_per_byte"]["val"] == d["bits_per_byte"]
  assert _result(workdir)["val_byte_counts"]["bytes"] == d["bytes"]  # the trainer's record has them too
  # another prepared set with the same tokenizer: a named key, the whole split by default
  other = str(tmp_path / "ood")
  shutil.copytree(data, other)
  assert nll.main([f"--workdir={workdir}", f"--data=ood={other}"]) == 0
  result = _result(workdir)
  assert set(result["eval"]) == {"val", "ood"} and result["eval_details"]["ood"]["batches"] > 3
  assert np.isfinite(result["eval"]["ood"]) and result["status"] == "done"
  # a set made with another tokenizer is refused
  manifest = prepare.load_manifest(other)
  manifest["tokenizer"] = {"name": "bpe", "file": "tokenizer.json", "requested_vocab_size": 300}
  with open(os.path.join(other, "manifest.json"), "w") as f:
    json.dump(manifest, f)
  assert nll.main([f"--workdir={workdir}", f"--data={other}"]) == 2
  assert "prepare it with the run's tokenizer" in capsys.readouterr().err


def test_loglik_equals_a_direct_forward_pass_including_left_truncation(run):
  workdir, data, config = run
  cfg, family, params = nll._load_run(workdir)
  manifest = prepare.load_manifest(data)
  tok = tokenizers.load_tokenizer(manifest["tokenizer"], data)
  eos = manifest["eos_id"]
  loglik = zeroshot.make_loglik(family, params, cfg, tok, eos, batch_size=4)
  requests = [("The union ", "is strong"), ("x" * 150 + " and so", " on"), ("", " hello")]
  got = loglik(requests)
  seq_len = int(cfg.data.seq_len)
  host_params = jax.device_get(params)
  apply = jax.jit(family.model.apply)
  for (ctx, cont), (ll, greedy) in zip(requests, got):
    ctx_ids, cont_ids = zeroshot.encode_pair(tok, ctx, cont, eos)
    whole = (ctx_ids + cont_ids)[-(seq_len + 1):]
    inp = jnp.asarray([whole[:-1]], jnp.int32)
    logits = apply({"params": host_params}, inp, jnp.ones_like(inp))[0]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    k = len(cont_ids)
    targets = np.asarray(whole[-k:])
    rows = logp[len(whole) - 1 - k:]
    expect = float(sum(rows[i, t] for i, t in enumerate(targets)))
    assert abs(ll - expect) < 1e-3, (ctx, cont, ll, expect)
    assert greedy == bool(np.all(np.argmax(np.asarray(logits[len(whole) - 1 - k:]), -1) == targets))
  # the harness's pair encoding: trailing context spaces move to the continuation
  assert zeroshot.encode_pair(tok, "The union ", "is", eos) == (list(b"The union"), list(b" is"))
  assert zeroshot.encode_pair(tok, "", "hi", eos) == ([eos], list(b"hi"))


def test_zeroshot_cli_writes_result_json(run, tmp_path, capsys):
  workdir, _, _ = run
  arc = tmp_path / "arc.jsonl"
  arc.write_text("".join(json.dumps(d) + "\n" for d in ARC))
  lam = tmp_path / "lambada.jsonl"
  lam.write_text(json.dumps({"text": "the people of the United States"}) + "\n")
  assert zeroshot.main([f"--workdir={workdir}", f"--task=arc_easy={arc}", f"--task=lambada={lam}"]) == 0
  printed = json.loads(capsys.readouterr().out)["zeroshot"]
  result = _result(workdir)
  assert result["zeroshot"]["arc_easy"]["n"] == 3 and 0.0 <= result["zeroshot"]["arc_easy"]["acc"] <= 1.0
  assert result["zeroshot"]["lambada"]["n"] == 1 and result["zeroshot"]["lambada"]["mean_loglik"] < 0
  assert printed["arc_easy"]["acc"] == result["zeroshot"]["arc_easy"]["acc"]
  assert "eval" in result and result["status"] == "done"  # other fields kept


def test_malformed_input_is_one_line_and_exit_2(run, tmp_path):
  workdir, _, _ = run
  arc = tmp_path / "arc.jsonl"
  arc.write_text(json.dumps(ARC[0]) + "\n" + '{"question": "broken"\n')
  cases = [
      (["nsl.evals.nll", f"--workdir={tmp_path / 'missing'}"], "no such run directory"),
      (["nsl.evals.zeroshot", f"--workdir={workdir}", f"--task=mmlu={arc}"], "unknown task 'mmlu'"),
      (["nsl.evals.zeroshot", f"--workdir={workdir}", f"--task=arc_easy={arc}"], f"{arc}:2: bad JSON"),
      (["nsl.evals.zeroshot", f"--workdir={tmp_path}", f"--task=arc_easy={tmp_path / 'none.jsonl'}"],
       "no such task file"),
  ]
  for args, message in cases:
    out = run_cli("-m", *args)
    assert out.returncode == 2, (args, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], (args, out.stderr)
