"""`nsl.models.teacher.precompute` writes through nsl.data.datadir: a checked, atomic data dir whose
token shards stay in the source dir and whose tokenizer (BPE file included) is the source's."""

import os

import numpy as np
import pytest

from nsl.data import datadir, pipeline, prepare
from nsl.errors import DataError
from nsl.models import teacher as teacher_lib
from tests.helpers import fake_run, sotu_texts, tiny_config


def test_precompute_on_a_bpe_dir_keeps_its_tokenizer(tmp_path):
  (tmp_path / "txt").mkdir()
  for i, text in enumerate(sotu_texts(8, chars=1500)):
    (tmp_path / "txt" / f"{i}.txt").write_text(text)
  data = str(tmp_path / "bpe")
  prepare.prepare(data, [str(tmp_path / "txt" / "*.txt")], "bpe", vocab_size=300, val_fraction=0.2)
  c = tiny_config(data, **{"model.vocab_size": 320, "data.tokenizer": "bpe", "data.tokenizer_vocab": 300,
                           "data.seq_len": 16, "model.attention_impl": "xla", "model.n_layers": 1})
  run, _, _ = fake_run(str(tmp_path / "teacher"), c)
  out = str(tmp_path / "states")
  m = teacher_lib.precompute(run, data, out, seq_len=16, top_k=4, batch_size=4)

  src = datadir.load_manifest(data)
  assert datadir.load_manifest(out) == m and m["tokenizer"] == src["tokenizer"]
  assert datadir.tokenizer_fingerprint(out, m) == datadir.tokenizer_fingerprint(data, src)
  for split in m["splits"]:
    datadir.verify_split(out, m, split, full_checksum=True)  # token shards (in `data`) and states
    assert all(os.path.dirname(s["file"]) == os.path.abspath(data) for s in m["splits"][split]["shards"])
  b = next(pipeline.make_train_iterator(out, seq_len=16, global_batch_size=2, seed=0))
  assert b["teacher_idx"].shape == (2, 17, 4) and b["teacher_idx"].max() < 320
  np.testing.assert_allclose(b["teacher_val"][:, :16].sum(-1), 1.0, atol=2e-3)  # top-k softmax rows
  assert sorted(p for p in os.listdir(tmp_path) if p.startswith(".")) == []  # no staging dir left

  with pytest.raises(DataError, match="already prepared; pass --force"):
    teacher_lib.precompute(run, data, out, seq_len=16, top_k=4, batch_size=4)
