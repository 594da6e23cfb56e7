"""Bytes per validation token (nsl.data.bytes_per_token), the bits-per-byte fields a run records."""

import json
import math
import os

import pytest

from nsl.data import bytes_per_token as bpt
from nsl.data import prepare, tokenizers

# Multi-byte UTF-8 (é, €: 2 and 3 bytes; 漢字: 3 each) so bytes, characters and tokens all differ.
TEXT = "Le café coûte 3 €; 漢字 are two characters, and so are these two. " * 12


def _prepared(tmp_path, tokenizer, **kwargs):
  text_dir = tmp_path / "text"
  text_dir.mkdir()
  for i in range(10):  # identical documents: whichever land in validation, each is TEXT
    (text_dir / f"doc{i}.txt").write_text(TEXT, encoding="utf-8")
  data_dir = str(tmp_path / "data")
  prepare.prepare(data_dir, [str(text_dir / "*.txt")], tokenizer=tokenizer, val_fraction=0.3, **kwargs)
  return data_dir


@pytest.mark.parametrize("tokenizer,kwargs", [("byte", {}), ("bpe", {"vocab_size": 300})])
def test_bytes_per_token_counts_utf8_bytes_per_scored_target(tmp_path, tokenizer, kwargs):
  data_dir = _prepared(tmp_path, tokenizer, **kwargs)
  manifest = prepare.load_manifest(data_dir)
  tok = tokenizers.load_tokenizer(manifest["tokenizer"], data_dir)
  n_tokens = len(tok.encode(TEXT))  # a document scores n_tokens targets (its EOS in, its first token out)
  want = len(TEXT.encode("utf-8")) / n_tokens
  got = bpt.val_bytes_per_token(data_dir)
  assert got == pytest.approx(want, rel=1e-12)
  if tokenizer == "byte":
    assert got == 1.0
  else:
    assert got > 1.5  # BPE merges bytes
  cache = json.loads(open(os.path.join(data_dir, bpt.CACHE)).read())
  assert cache["measure"]["bytes_per_token"] == got
  fields = bpt.record_fields(data_dir, {"val": 2.0, "other": float("nan")})
  assert fields["val_bytes_per_token"] == got
  assert fields["eval_bits_per_byte"] == {"val": pytest.approx(2.0 / math.log(2) / got)}


def test_an_unwritable_or_missing_data_dir(tmp_path, monkeypatch):
  assert bpt.record_fields(str(tmp_path / "nowhere"), {"val": 2.0}) == {}
  data_dir = _prepared(tmp_path, "byte")

  def refuse(src, dst):
    raise PermissionError(13, "Permission denied", dst)

  monkeypatch.setattr(bpt.os, "replace", refuse)  # a read-only data dir: measured, not cached
  assert bpt.val_bytes_per_token(data_dir) == 1.0
  assert not os.path.exists(os.path.join(data_dir, bpt.CACHE))
