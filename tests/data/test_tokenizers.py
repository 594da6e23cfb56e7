"""Tokenizers: ids, EOS handling, determinism of BPE training, GPT-2 from a local ranks file (built
from a package: tests/data/conftest.py's gpt2_ranks)."""

import os

import pytest

from nsl.data import tokenizers as tok_lib
from nsl.errors import DataError

TEXT = "Hello world, naïve café — 日本 <|endoftext|> end"


def test_byte_roundtrip_and_eos():
  tok = tok_lib.ByteTokenizer()
  ids = tok.encode(TEXT)
  assert (tok.vocab_size, tok.eos_id) == (257, 256)
  assert ids == list(TEXT.encode("utf-8")) and tok.eos_id not in ids
  assert tok.decode(ids) == TEXT
  assert tok.decode(tok.encode("a") + [256] + tok.encode("b")) == "a<|endoftext|>b"
  assert tok_lib.load_tokenizer(tok.spec(), "/nonexistent").encode("x") == [120]


def test_bpe_is_deterministic_and_roundtrips(corpus, tmp_path):
  _, texts = corpus
  a = tok_lib.BpeTokenizer.train(texts, vocab_size=300)
  b = tok_lib.BpeTokenizer.train(list(texts), vocab_size=300)
  assert a.to_json() == b.to_json()
  assert 257 < a.vocab_size <= 300
  ids = a.encode(TEXT)
  assert a.eos_id not in ids  # a literal "<|endoftext|>" is text, not a document boundary
  assert max(ids) < a.vocab_size and a.decode(ids) == TEXT
  assert len(a.encode(texts[0])) < len(texts[0].encode("utf-8"))  # it learned merges
  a.save(str(tmp_path))
  c = tok_lib.load_tokenizer(a.spec(), str(tmp_path))
  assert (c.encode(TEXT), c.eos_id, c.vocab_size) == (ids, a.eos_id, a.vocab_size)
  assert c.encode_batch([TEXT, "x"]) == [ids, a.encode("x")]


def test_gpt2_from_file_and_env(gpt2_ranks, tmp_path, monkeypatch):
  tok = tok_lib.Gpt2Tokenizer.from_file(gpt2_ranks)
  assert tok.encode("Hello world") == [15496, 995]
  assert (tok.vocab_size, tok.eos_id) == (50257, 50256)
  assert tok.eos_id not in tok.encode(TEXT) and tok.decode(tok.encode(TEXT)) == TEXT
  monkeypatch.setenv(tok_lib.GPT2_BPE_ENV, gpt2_ranks)
  assert tok_lib.Gpt2Tokenizer.locate().encode("Hello world") == [15496, 995]
  tok.save(str(tmp_path))  # the data dir gets its own copy of the ranks
  again = tok_lib.load_tokenizer(tok.spec(), str(tmp_path))
  assert again.encode_batch(["Hello world"]) == [[15496, 995]]


def test_gpt2_without_ranks_says_how_to_fix(monkeypatch):
  import tiktoken

  def offline(name):
    raise ConnectionError("no network")

  monkeypatch.delenv(tok_lib.GPT2_BPE_ENV, raising=False)
  monkeypatch.setattr(tiktoken, "get_encoding", offline)
  with pytest.raises(DataError, match="NSL_GPT2_BPE"):
    tok_lib.Gpt2Tokenizer.locate()
  with pytest.raises(DataError, match="missing.tiktoken"):
    tok_lib.Gpt2Tokenizer.locate("/nonexistent/missing.tiktoken")


def test_load_tokenizer_rejects_unknown_spec(tmp_path):
  with pytest.raises(DataError, match="unknown tokenizer"):
    tok_lib.load_tokenizer({"name": "sentencepiece"}, str(tmp_path))
  with pytest.raises(DataError, match="tokenizer.json"):
    tok_lib.load_tokenizer({"name": "bpe", "file": "tokenizer.json"}, str(tmp_path))
