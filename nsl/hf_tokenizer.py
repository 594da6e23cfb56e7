"""A run's tokenizer as Hugging Face tokenizer files (`python -m nsl.hf export`).

Every nsl tokenizer is a byte-level BPE, so each becomes one `tokenizer.json` that
`PreTrainedTokenizerFast` (and `AutoTokenizer`) loads, built offline with the `tokenizers`
library (docs/guide/huggingface.md#tokenizers):

- `bpe` (trained on the corpus): its own `tokenizer.json`, as nsl encodes with it;
- `gpt2` (tiktoken): GPT-2's vocabulary and merges recovered from tiktoken's ranks (each token's
  merge is the split that BPE over the lower ranks reaches), with GPT-2's split pattern; also
  `vocab.json` and `merges.txt`, the files of `GPT2TokenizerFast`;
- `byte`: the 256 bytes (id = byte value) and EOS, no merges.

One difference stays: nsl encodes a literal "<|endoftext|>" in text as text, a HF tokenizer as
the EOS token.
"""

from __future__ import annotations

import json
import os

from nsl.data.tokenizers import EOS_TEXT, GPT2_PAT
from nsl.errors import DataError


def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable character table (byte-level BPE's alphabet)."""
  bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return dict(zip(bs, map(chr, cs)))


def _split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
  """BPE of `token`'s bytes merging only pairs of rank < max_rank (tiktoken's rule: the pair whose
  concatenation has the lowest rank first)."""
  parts = [bytes([b]) for b in token]
  while True:
    best = None
    for i in range(len(parts) - 1):
      r = ranks.get(parts[i] + parts[i + 1])
      if r is not None and r < max_rank and (best is None or r < best[0]):
        best = (r, i)
    if best is None:
      return parts
    i = best[1]
    parts[i:i + 2] = [parts[i] + parts[i + 1]]


def from_ranks(ranks: dict[bytes, int], eos_id: int, pattern: str | None = GPT2_PAT):
  """A `tokenizers.Tokenizer` encoding as tiktoken does with `ranks` (token bytes -> id) and the
  split `pattern` (None: no split), EOS `<|endoftext|>` at `eos_id`."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

  char = bytes_to_unicode()
  text = lambda b: "".join(char[x] for x in b)
  vocab = {text(tok): rank for tok, rank in ranks.items()}
  merges = []
  for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
    if len(tok) < 2:
      continue
    parts = _split(ranks, tok, rank)
    if len(parts) != 2:
      raise DataError(f"tiktoken ranks: token {tok!r} (rank {rank}) is not one merge of two lower-ranked tokens")
    merges.append((text(parts[0]), text(parts[1])))
  tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.pre_tokenizer = (byte_level if pattern is None else
                       pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"), byte_level]))
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([EOS_TEXT])
  if tok.token_to_id(EOS_TEXT) != eos_id:
    raise DataError(f"EOS landed at id {tok.token_to_id(EOS_TEXT)}, not {eos_id}: the ranks must be ids 0..{eos_id - 1}")
  return tok


def hf_tokenizer(tok, data_dir: str):
  """The `tokenizers.Tokenizer` that encodes as the nsl tokenizer `tok` does."""
  from tokenizers import Tokenizer

  if tok.name == "bpe":
    return Tokenizer.from_str(tok.to_json())
  if tok.name == "gpt2":
    import tiktoken.load

    ranks = tiktoken.load.load_tiktoken_bpe(os.path.join(data_dir, tok.spec()["file"]))
    return from_ranks(ranks, tok.eos_id)
  if tok.name == "byte":
    return from_ranks({bytes([b]): b for b in range(256)}, tok.eos_id, pattern=None)
  raise DataError(f"tokenizer {tok.name!r} has no Hugging Face export")


def write(tok, data_dir: str, max_length: int, out_dir: str) -> list[str]:
  """Writes tokenizer.json, tokenizer_config.json, special_tokens_map.json (GPT-2: also vocab.json
  and merges.txt) into `out_dir`; returns their names."""
  hf = hf_tokenizer(tok, data_dir)
  hf.save(os.path.join(out_dir, "tokenizer.json"))
  files = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
  if tok.name == "gpt2":
    files += hf.model.save(out_dir)  # vocab.json, merges.txt
    files = [os.path.basename(f) for f in files]
  specials = {"bos_token": EOS_TEXT, "eos_token": EOS_TEXT, "unk_token": EOS_TEXT}
  config = dict(specials, tokenizer_class="GPT2Tokenizer" if tok.name == "gpt2" else "PreTrainedTokenizerFast",
                model_max_length=int(max_length), add_bos_token=False, add_prefix_space=False,
                clean_up_tokenization_spaces=False)
  for name, obj in (("tokenizer_config.json", config), ("special_tokens_map.json", specials)):
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as fh:
      json.dump(obj, fh, indent=2, sort_keys=True)
      fh.write("\n")
  return files
