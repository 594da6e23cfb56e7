"""Multi-operand arithmetic without chain of thought: add and subtract 2–10 one-digit numbers.

  python -m nsl.data.tasks.arithmetic --out=data/arith [--train_sequences=200000] [--seed=0]

Vocabulary (`VOCAB`, 14 ids): '0'..'9' -> 0..9, '+' 10, '-' 11, '=' 12, EOS 13. A problem with m
operands (m uniform in [2, 10], digits uniform in 0..9, operators uniform in {+, -}) is written
`d1 o2 d2 ... om dm = answer EOS`, the answer in decimal with a leading '-' when negative
(range -81..90): at most 19 + 1 + 3 + 1 = 24 tokens, padded with EOS to one window of
`seq_len + 1 = 25` tokens. The answer follows '=' directly (no intermediate results). Labels:
the next token at the positions from '=' to the answer's last token (the answer and its EOS),
none elsewhere, so only the answer is trained and scored.

Output: a prepared data dir (tokenizer `task:arithmetic`, `label_shards`, see
nsl.data.datadir.write_labelled_dir) plus `heldout.npz` with `heldout_per_count` problems per
operand count m = 2..10 (`tokens_m`, `labels_m`, padded windows), for procedural evaluation:
`answer_accuracy` scores exact-match of the greedy answer per m.
"""

from __future__ import annotations

import sys

import numpy as np

from nsl.data import datadir
from nsl.errors import ArgumentParser, ConfigError, cli_main

PLUS, MINUS, EQUALS, EOS_ID = 10, 11, 12, 13
VOCAB = tuple("0123456789+-=") + ("<eos>",)
VOCAB_SIZE = len(VOCAB)
MIN_OPERANDS, MAX_OPERANDS = 2, 10
WINDOW = 2 * MAX_OPERANDS - 1 + 1 + 3 + 1  # 24 tokens at most, + 1 = 25 with room for padding
TOKENIZER = "task:arithmetic"


def encode_problem(digits, ops) -> tuple[list[int], int]:
  """Tokens of `d1 o2 d2 ... = answer EOS` and the answer (ops[i] in {+1, -1} applies to digits[i+1])."""
  value = int(digits[0])
  toks = [int(digits[0])]
  for d, o in zip(digits[1:], ops):
    toks += [PLUS if o > 0 else MINUS, int(d)]
    value += int(o) * int(d)
  toks.append(EQUALS)
  toks += ([MINUS] if value < 0 else []) + [int(c) for c in str(abs(value))]
  toks.append(EOS_ID)
  return toks, value


def labels_for(tokens: list[int]) -> list[int]:
  """Next-token labels from '=' to the last answer token; -1 elsewhere (aligned with tokens)."""
  eq = tokens.index(EQUALS)
  return [tokens[i + 1] if eq <= i < len(tokens) - 1 else -1 for i in range(len(tokens))]


def sample(rng: np.random.Generator, n: int, counts) -> tuple[np.ndarray, np.ndarray]:
  """n problems padded to WINDOW + 1 tokens (EOS) with labels (-1 = none): int64 [n, WINDOW + 1]."""
  counts = np.broadcast_to(np.asarray(counts), (n,))
  tok = np.full((n, WINDOW + 1), EOS_ID, np.int64)
  lab = np.full((n, WINDOW + 1), -1, np.int64)
  for i, m in enumerate(counts):
    digits = rng.integers(0, 10, int(m))
    ops = rng.choice([1, -1], int(m) - 1)
    t, _ = encode_problem(digits, ops)
    tok[i, :len(t)] = t
    lab[i, :len(t)] = labels_for(t)
  return tok, lab


def generate(out_dir: str, train_sequences: int = 200_000, val_sequences: int = 2_000, heldout_per_count: int = 1_000,
             seed: int = 0, force: bool = False) -> dict:
  if train_sequences <= 0 or val_sequences <= 0 or heldout_per_count <= 0:
    raise ConfigError("train_sequences, val_sequences and heldout_per_count must be positive")
  rngs = [np.random.default_rng([seed, 100 + i]) for i in range(3)]
  splits = {}
  for (split, n), rng in zip((("train", train_sequences), ("val", val_sequences)), rngs):
    tok, lab = sample(rng, n, rng.integers(MIN_OPERANDS, MAX_OPERANDS + 1, n))
    splits[split] = (tok.astype("<u2"), np.where(lab >= 0, lab, datadir.LABEL_IGNORE).astype("<u2"))
  held = {}
  for m in range(MIN_OPERANDS, MAX_OPERANDS + 1):
    tok, lab = sample(rngs[2], heldout_per_count, m)
    held[f"tokens_{m}"], held[f"labels_{m}"] = tok.astype(np.int8), lab.astype(np.int8)
  task = {"name": "arithmetic", "operands": [MIN_OPERANDS, MAX_OPERANDS], "vocab": list(VOCAB),
          "heldout": "heldout.npz", "seq_len": WINDOW}
  return datadir.write_labelled_dir(out_dir, splits, tokenizer=TOKENIZER, vocab_size=VOCAB_SIZE, eos_id=EOS_ID,
                                    seed=seed, val_fraction=0.01, extra=task, extra_files={"heldout.npz": held},
                                    force=force)


def answer_accuracy(logits_BTV: np.ndarray, labels_BT: np.ndarray) -> float:
  """Fraction of problems whose every answer label (teacher-forced) is the argmax prediction."""
  pred = np.argmax(np.asarray(logits_BTV), -1)
  labels = np.asarray(labels_BT)[:, :pred.shape[1]]
  ok = np.where(labels >= 0, pred == labels, True).all(axis=1)
  return float(ok.mean())


def main(argv=None) -> int:
  p = ArgumentParser(prog="python -m nsl.data.tasks.arithmetic", description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True, help="the task data dir to write")
  p.add_argument("--train_sequences", type=int, default=200_000, help="training sequences to generate")
  p.add_argument("--val_sequences", type=int, default=2_000, help="validation sequences to generate")
  p.add_argument("--heldout_per_count", type=int, default=1_000, help="held-out problems per operand count")
  p.add_argument("--seed", type=int, default=0, help="random seed of the problems")
  p.add_argument("--force", action="store_true", help="rewrite an existing data dir")
  a = p.parse_args(argv)
  generate(a.out, a.train_sequences, a.val_sequences, a.heldout_per_count, a.seed, a.force)
  print(f"arithmetic: wrote {a.out} (data.seq_len={WINDOW})", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(cli_main(main)())
