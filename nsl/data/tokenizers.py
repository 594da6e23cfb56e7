"""Tokenizers: byte-level, GPT-2 (tiktoken) and a BPE trained on the corpus (HF `tokenizers`).

Every tokenizer has one end-of-document id, `eos_id`, which `prepare` appends after each
document and the pipeline uses to derive segment ids. `encode` never produces `eos_id` from
text: a literal "<|endoftext|>" inside a document is encoded as ordinary text, so document
boundaries come only from the corpus structure.

A tokenizer describes itself with `spec()`, a JSON-able dict stored in the data manifest;
files it needs (the BPE's `tokenizer.json`, GPT-2's ranks) are written into the data directory
by `save(out_dir)`, so `load_tokenizer(spec, data_dir)` rebuilds it from the directory alone.
"""

from __future__ import annotations

import base64
import os
from typing import Iterable, Protocol, Sequence

from nsl.errors import ConfigError, DataError

EOS_TEXT = "<|endoftext|>"
GPT2_BPE_ENV = "NSL_GPT2_BPE"
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOS_ID = 50256
NAMES = ("byte", "bpe", "gpt2")


class Tokenizer(Protocol):
  """What `prepare` and evaluation need from a tokenizer."""

  name: str
  vocab_size: int  # number of ids, EOS included; every id is in [0, vocab_size)
  eos_id: int

  def encode(self, text: str) -> list[int]: ...

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

  def decode(self, ids: Sequence[int]) -> str: ...

  def spec(self) -> dict: ...

  def save(self, out_dir: str) -> None: ...


class ByteTokenizer:
  """UTF-8 bytes 0..255 plus EOS = 256. Needs no files and no training."""

  name = "byte"
  vocab_size = 257
  eos_id = 256

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def decode(self, ids: Sequence[int]) -> str:
    # EOS has no bytes; show it as its conventional text so decoded samples stay readable.
    out, run = [], bytearray()
    for i in ids:
      if int(i) == self.eos_id:
        out.append(run.decode("utf-8", errors="replace") + EOS_TEXT)
        run = bytearray()
      else:
        run.append(int(i))
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)

  def spec(self) -> dict:
    return {"name": "byte"}

  def save(self, out_dir: str) -> None:
    del out_dir  # nothing to save


class BpeTokenizer:
  """Byte-level BPE trained on the corpus with HF `tokenizers`; EOS is `<|endoftext|>`."""

  name = "bpe"
  FILE = "tokenizer.json"

  def __init__(self, hf_tokenizer, requested_vocab_size: int):
    self._tok = hf_tokenizer
    # Literal "<|endoftext|>" in a document is text, not a document boundary.
    self._tok.encode_special_tokens = True
    self.requested_vocab_size = int(requested_vocab_size)
    self.vocab_size = int(hf_tokenizer.get_vocab_size(with_added_tokens=True))
    eos = hf_tokenizer.token_to_id(EOS_TEXT)
    if eos is None:
      raise DataError(f"BPE tokenizer has no {EOS_TEXT} token; re-run nsl.data.prepare")
    self.eos_id = int(eos)

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int) -> "BpeTokenizer":
    """Trains a byte-level BPE; the result depends only on the texts and vocab_size."""
    from tokenizers import Tokenizer as HfTokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257 or vocab_size > 1 << 20:
      raise ConfigError(f"vocab_size={vocab_size} for the bpe tokenizer must be in [257, 2**20] "
                        "(256 byte tokens + EOS at least)")
    tok = HfTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_TEXT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(texts, trainer=trainer)
    return cls(tok, vocab_size)

  @classmethod
  def load(cls, path: str, requested_vocab_size: int) -> "BpeTokenizer":
    from tokenizers import Tokenizer as HfTokenizer

    try:
      tok = HfTokenizer.from_file(path)
    except Exception as e:  # the library raises plain Exception subclasses for bad files
      raise DataError(f"cannot read BPE tokenizer {path}: {e}; re-run nsl.data.prepare") from None
    return cls(tok, requested_vocab_size)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

  def to_json(self) -> str:
    return self._tok.to_str()

  def spec(self) -> dict:
    return {"name": "bpe", "file": self.FILE, "requested_vocab_size": self.requested_vocab_size,
            "vocab_size": self.vocab_size}

  def save(self, out_dir: str) -> None:
    self._tok.save(os.path.join(out_dir, self.FILE))


class Gpt2Tokenizer:
  """The GPT-2 BPE (50257 ids, EOS 50256) via tiktoken, built from a local ranks file."""

  name = "gpt2"
  FILE = "gpt2.tiktoken"
  batch_threads = 2  # tiktoken's threads per encode_batch; prepare's worker processes use 1 each

  def __init__(self, mergeable_ranks: dict[bytes, int]):
    import tiktoken

    self._ranks = mergeable_ranks
    self._enc = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=mergeable_ranks,
                                  special_tokens={EOS_TEXT: GPT2_EOS_ID})
    self.vocab_size = int(self._enc.n_vocab)
    self.eos_id = GPT2_EOS_ID

  @classmethod
  def from_file(cls, path: str) -> "Gpt2Tokenizer":
    import tiktoken.load

    if not os.path.isfile(path):
      raise DataError(f"GPT-2 BPE ranks file {path} not found; point --gpt2_bpe or "
                      f"{GPT2_BPE_ENV} at a gpt2.tiktoken file")
    try:
      ranks = tiktoken.load.load_tiktoken_bpe(path)
    except Exception as e:  # malformed base64 / ranks lines
      raise DataError(f"cannot read GPT-2 BPE ranks file {path}: {e}") from None
    if len(ranks) != GPT2_EOS_ID:
      raise DataError(f"GPT-2 BPE ranks file {path} has {len(ranks)} ranks, expected "
                      f"{GPT2_EOS_ID}; use the r50k/gpt2 ranks file")
    return cls(ranks)

  @classmethod
  def locate(cls, path: str | None = None) -> "Gpt2Tokenizer":
    """From `path`, else $NSL_GPT2_BPE, else tiktoken's own download (needs the internet)."""
    path = path or os.environ.get(GPT2_BPE_ENV)
    if path:
      return cls.from_file(path)
    try:
      import tiktoken

      enc = tiktoken.get_encoding("gpt2")
      return cls(enc._mergeable_ranks)  # pylint: disable=protected-access
    except Exception:  # offline, blocked cache dir, ...: all mean "no ranks available"
      raise DataError(f"no GPT-2 BPE ranks: set {GPT2_BPE_ENV}=/path/to/gpt2.tiktoken "
                      "(or pass --gpt2_bpe); tiktoken could not download it") from None

  def encode(self, text: str) -> list[int]:
    return self._enc.encode_ordinary(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._enc.encode_ordinary_batch(list(texts), num_threads=self.batch_threads)

  def decode(self, ids: Sequence[int]) -> str:
    return self._enc.decode([int(i) for i in ids])

  def spec(self) -> dict:
    return {"name": "gpt2", "file": self.FILE}

  def save(self, out_dir: str) -> None:
    # A copy in the data dir makes it self-contained: evaluation needs no env var. Written by
    # hand in tiktoken's format (base64 token, space, rank): tiktoken's dump needs `blobfile`.
    with open(os.path.join(out_dir, self.FILE), "w", encoding="ascii") as f:
      for token, rank in sorted(self._ranks.items(), key=lambda kv: kv[1]):
        f.write(f"{base64.b64encode(token).decode('ascii')} {rank}\n")


def check_name(name: str) -> None:
  if name not in NAMES:
    raise ConfigError(f"tokenizer={name!r} is not one of {', '.join(NAMES)}")


def load_tokenizer(spec: dict, data_dir: str) -> Tokenizer:
  """Rebuilds the tokenizer described by a manifest's `tokenizer` spec from `data_dir`."""
  name = spec.get("name") if isinstance(spec, dict) else None
  if name == "byte":
    return ByteTokenizer()
  if name == "bpe":
    path = os.path.join(data_dir, spec.get("file", BpeTokenizer.FILE))
    if not os.path.isfile(path):
      raise DataError(f"BPE tokenizer file {path} is missing; re-run nsl.data.prepare")
    return BpeTokenizer.load(path, spec.get("requested_vocab_size", 0))
  if name == "gpt2":
    return Gpt2Tokenizer.from_file(os.path.join(data_dir, spec.get("file", Gpt2Tokenizer.FILE)))
  raise DataError(f"unknown tokenizer spec {spec!r} in {os.path.join(data_dir, 'manifest.json')}; "
                  "re-run nsl.data.prepare")
