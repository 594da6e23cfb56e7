"""`nsl.data.prepare --tokenizer_from=DIR`: another corpus tokenized with a data dir's own tokenizer
(BPE file included), accepted by `nsl.evals.nll --data`; bad DIRs are one line and exit 2."""

import json
import os

import numpy as np
import pytest

from nsl.data import datadir, prepare, sources, tokenizers
from nsl.errors import DataError

OTHER_WORDS = ["river", "mountain", "lantern", "quiet", "harbour", "orchard", "the", "of", "stone"]


def _other_corpus(root) -> tuple[str, list[str]]:
  """A corpus of other words than the fixture's: the ood text for the reused tokenizer."""
  rng = np.random.default_rng(5)
  os.makedirs(root, exist_ok=True)
  texts = []
  for i in range(8):
    text = f"note {i}: " + " ".join(rng.choice(OTHER_WORDS, size=int(rng.integers(10, 60))))
    with open(os.path.join(root, f"n{i}.txt"), "w", encoding="utf-8") as f:
      f.write(text)
    texts.append(text)
  return os.path.join(root, "*.txt"), texts


@pytest.fixture(scope="module")
def bpe_dir(corpus, tmp_path_factory):
  out = str(tmp_path_factory.mktemp("bpe") / "bpe")
  prepare.prepare(out, [corpus[0]], "bpe", vocab_size=300, val_fraction=0.2)
  return out


def _tokens(data_dir, split="train"):
  m = datadir.load_manifest(data_dir)
  return np.concatenate([np.fromfile(os.path.join(data_dir, s["file"]), dtype=m["dtype"])
                         for s in m["splits"][split]["shards"]])


def test_reused_bpe_gives_the_original_ids_and_fingerprint(bpe_dir, tmp_path):
  spec, texts = _other_corpus(str(tmp_path / "txt"))
  out = str(tmp_path / "ood")
  m = prepare.prepare(out, [spec], tokenizer_from=bpe_dir, val_fraction=0.0)
  src = datadir.load_manifest(bpe_dir)
  assert m["tokenizer"] == src["tokenizer"] and m["vocab_size"] == src["vocab_size"]
  assert m["tokenizer_from"] == os.path.abspath(bpe_dir)
  with open(os.path.join(bpe_dir, "tokenizer.json"), "rb") as a, open(os.path.join(out, "tokenizer.json"), "rb") as b:
    assert a.read() == b.read()
  assert datadir.tokenizer_fingerprint(out, m) == datadir.tokenizer_fingerprint(bpe_dir, src)
  original = tokenizers.load_tokenizer(src["tokenizer"], bpe_dir)
  want = np.concatenate([original.encode(t) + [original.eos_id] for t in texts])
  np.testing.assert_array_equal(_tokens(out), want)
  # A BPE trained afresh on this text would give other ids: the reuse is what made them equal.
  fresh = prepare.prepare(str(tmp_path / "fresh"), [spec], "bpe", vocab_size=300, val_fraction=0.0)
  assert datadir.tokenizer_fingerprint(str(tmp_path / "fresh"), fresh) != datadir.tokenizer_fingerprint(out, m)

  # The CLI: a second run reuses the dir; a dir made with another BPE is refused.
  assert prepare.main([f"--source={spec}", f"--tokenizer_from={bpe_dir}", f"--out={out}", "--val_fraction=0"]) == 0
  with pytest.raises(DataError, match="not the one of --tokenizer_from"):
    prepare.ensure_prepared(out, [spec], "bpe", val_fraction=0.0, tokenizer_from=str(tmp_path / "fresh"))


def test_pydoc_source_is_offline_english(tmp_path):
  docs = list(sources.iter_source("pydoc"))
  assert len(docs) >= 50 and any("statement" in d for d in docs[:10])
  sources.check_source("pydoc")
  m = prepare.prepare(str(tmp_path / "p"), ["pydoc"], "byte", max_docs=3, val_fraction=0.0)
  assert m["splits"]["train"]["documents"] == 3


def _cli_error(capsys, *argv) -> str:
  assert prepare.main(list(argv)) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1, err
  return err


def test_bad_tokenizer_from_is_one_line_exit_2(bpe_dir, tmp_path, capsys):
  text = tmp_path / "a.txt"
  text.write_text("some text " * 10)
  args = (f"--source={text}", f"--out={tmp_path / 'out'}")
  assert "no such directory" in _cli_error(capsys, *args, f"--tokenizer_from={tmp_path / 'nope'}")
  (tmp_path / "empty").mkdir()
  assert "no manifest.json" in _cli_error(capsys, *args, f"--tokenizer_from={tmp_path / 'empty'}")
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"data": {"path": bpe_dir}}))
  assert f"run directory; pass its data dir (its config data.path: {bpe_dir})" in \
      _cli_error(capsys, *args, f"--tokenizer_from={run}")
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "manifest.json").write_text("{not json")
  assert "is not valid JSON" in _cli_error(capsys, *args, f"--tokenizer_from={bad}")
  (bad / "manifest.json").write_text(json.dumps({**datadir.load_manifest(bpe_dir), "tokenizer": {"name": "task:s5"}}))
  assert "needs a text tokenizer" in _cli_error(capsys, *args, f"--tokenizer_from={bad}")
  (bad / "manifest.json").write_text(json.dumps(datadir.load_manifest(bpe_dir)))  # no tokenizer.json beside it
  assert "tokenizer.json is missing" in _cli_error(capsys, *args, f"--tokenizer_from={bad}")
  assert "drop --tokenizer, --vocab_size" in _cli_error(capsys, *args, f"--tokenizer_from={bpe_dir}",
                                                        "--tokenizer=bpe", "--vocab_size=300")
  assert not (tmp_path / "out").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]


def test_nll_accepts_the_reused_tokenizer_and_refuses_another(bpe_dir, tmp_path, capsys):
  from nsl.evals import nll
  from tests.helpers import fake_run, tiny_config

  spec, _ = _other_corpus(str(tmp_path / "txt"))
  ood = str(tmp_path / "ood")
  prepare.prepare(ood, [spec], tokenizer_from=bpe_dir, val_fraction=0.5)
  c = tiny_config(bpe_dir, **{"model.vocab_size": 320, "data.tokenizer": "bpe", "data.tokenizer_vocab": 300,
                              "data.seq_len": 16, "model.attention_impl": "xla"})
  workdir, _, _ = fake_run(str(tmp_path / "run"), c)
  assert nll.main([f"--workdir={workdir}", f"--data=ood={ood}", "--max_batches=1", "--batch_size=8"]) == 0
  printed = json.loads(capsys.readouterr().out)
  assert np.isfinite(printed["eval"]["ood"]) and printed["eval_details"]["ood"]["data"] == os.path.abspath(ood)
  other = str(tmp_path / "other_bpe")  # a BPE of the same size trained on other text: other ids
  prepare.prepare(other, [spec], "bpe", vocab_size=300, val_fraction=0.5)
  assert nll.main([f"--workdir={workdir}", f"--data={other}", "--max_batches=1", "--batch_size=8"]) == 2
  assert "prepare it with the run's tokenizer" in capsys.readouterr().err
