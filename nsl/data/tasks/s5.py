"""S5 state tracking (docs/papers/lift.md#s5): compose permutations of 5 elements.

  python -m nsl.data.tasks.s5 --out=data/s5 [--train_sequences=200000] [--seed=0]

Group: S5 as the 120 permutations of (0..4) in lexicographic order (id 0 = identity). A
permutation p maps i -> p[i]; applying generator g to state s gives g∘s, (g∘s)[i] = g[s[i]].
The 12 fixed generators (`GENERATORS`, ids 120..131):
  the 4 adjacent transpositions (0 1) (1 2) (2 3) (3 4); the 5-cycle (0 1 2 3 4) and its
  inverse; the 3-cycles (0 1 2), (2 3 4) and their inverses; the double transpositions
  (0 1)(2 3) and (1 2)(3 4). (The paper does not list its own 12: docs/papers/lift.md#s5.)

A sequence of length N: tokens `[s0, g1, ..., gN, EOS]` with a uniformly random initial state
s0 (a state token) and N uniform generators; labels aligned with the tokens
`[s0, s1, ..., sN, -]`, s_t = g_t∘s_{t-1}: at every input position the model predicts the
current state (not the next token). Each sequence is padded with EOS (label none) to one
window of `seq_len + 1 = max_train_len + 2` tokens, so with `data.seq_len = max_train_len + 1`
every training window is exactly one sequence.

Output: a prepared data dir (`nsl.data.datadir.write_labelled_dir`, tokenizer name `task:s5`) whose
splits also list `label_shards` (the pipeline then adds `labels` to every batch; see
nsl/data/pipeline.py), plus `heldout.npz` with 2,000 sequences per length N = 1..64
(`tokens_N`, `labels_N`, uint8 [n, N+1], no EOS) drawn from a separate seed stream, for
`nsl.evals.length_generalization`. Training lengths are uniform in [1, max_train_len = 16].
Accuracy at length N is the fraction of held-out sequences whose final state s_N is predicted
(argmax) at the last position; chance is 1/120.
"""

from __future__ import annotations

import itertools
import os
import sys

import numpy as np

from nsl.data import datadir
from nsl.errors import ArgumentParser, ConfigError, DataError, cli_main

NUM_STATES = 120
PERMS = np.array(list(itertools.permutations(range(5))), np.int64)  # [120, 5], lexicographic
_INDEX = {tuple(p): i for i, p in enumerate(PERMS.tolist())}


def _cycle(*cycles) -> tuple[int, ...]:
  p = list(range(5))
  for c in cycles:
    for a, b in zip(c, c[1:] + c[:1]):
      p[a] = b
  return tuple(p)


GENERATOR_PERMS = (
    _cycle((0, 1)), _cycle((1, 2)), _cycle((2, 3)), _cycle((3, 4)),
    _cycle((0, 1, 2, 3, 4)), _cycle((4, 3, 2, 1, 0)),
    _cycle((0, 1, 2)), _cycle((2, 1, 0)), _cycle((2, 3, 4)), _cycle((4, 3, 2)),
    _cycle((0, 1), (2, 3)), _cycle((1, 2), (3, 4)),
)
NUM_GENERATORS = len(GENERATOR_PERMS)
GENERATOR_BASE = NUM_STATES  # token id of generator j is 120 + j
EOS_ID = NUM_STATES + NUM_GENERATORS  # 132
VOCAB_SIZE = EOS_ID + 1
LABEL_IGNORE = datadir.LABEL_IGNORE
TOKENIZER = "task:s5"
GENERATORS = tuple(_INDEX[g] for g in GENERATOR_PERMS)  # state ids of the generators


def compose_table() -> np.ndarray:
  """table[g, s] = state id of GENERATOR_PERMS[g] ∘ PERMS[s]."""
  g = np.array(GENERATOR_PERMS, np.int64)  # [12, 5]
  composed = g[np.arange(NUM_GENERATORS)[:, None, None], PERMS[None, :, :]]  # [12, 120, 5]: g[s[i]]
  return np.array([[_INDEX[tuple(row)] for row in per_g] for per_g in composed.tolist()], np.int64)


TABLE = compose_table()


def sample(rng: np.random.Generator, n: int, length: int | np.ndarray, width: int | None = None):
  """n sequences: tokens and labels int64 [n, width] (width = max length + 1, no EOS/padding:
  positions past a row's length hold -1). `length` is an int or an array of n lengths."""
  lengths = np.broadcast_to(np.asarray(length, np.int64), (n,))
  width = width or int(lengths.max()) + 1
  s0 = rng.integers(0, NUM_STATES, n)
  gens = rng.integers(0, NUM_GENERATORS, (n, width - 1))
  states = np.empty((n, width), np.int64)
  states[:, 0] = s0
  for t in range(1, width):
    states[:, t] = TABLE[gens[:, t - 1], states[:, t - 1]]
  tokens = np.concatenate([s0[:, None], GENERATOR_BASE + gens], axis=1)
  valid = np.arange(width)[None, :] <= lengths[:, None]
  return np.where(valid, tokens, -1), np.where(valid, states, -1)


def to_windows(tokens: np.ndarray, labels: np.ndarray, window: int, eos_id: int):
  """Rows padded with EOS to `window` tokens (labels LABEL_IGNORE there); uint16."""
  n, w = tokens.shape
  if w >= window:
    raise ConfigError(f"sequences of {w} tokens do not fit a window of {window} with their EOS")
  tok = np.full((n, window), eos_id, np.int64)
  lab = np.full((n, window), LABEL_IGNORE, np.int64)
  tok[:, :w] = np.where(tokens >= 0, tokens, eos_id)
  lab[:, :w] = np.where(labels >= 0, labels, LABEL_IGNORE)
  return tok.astype("<u2"), lab.astype("<u2")


def generate(out_dir: str, train_sequences: int = 200_000, val_sequences: int = 2_000, max_train_len: int = 16,
             heldout_per_length: int = 2_000, max_eval_len: int = 64, seed: int = 0, force: bool = False) -> dict:
  """Writes the S5 data dir (see the module docstring); returns its manifest."""
  if train_sequences <= 0 or val_sequences <= 0 or max_train_len <= 0 or heldout_per_length <= 0:
    raise ConfigError("train_sequences, val_sequences, max_train_len and heldout_per_length must be positive")
  window = max_train_len + 2
  train_rng, val_rng, held_rng = (np.random.default_rng([seed, i]) for i in range(3))
  splits = {}
  for split, rng, n in (("train", train_rng, train_sequences), ("val", val_rng, val_sequences)):
    lengths = rng.integers(1, max_train_len + 1, n)
    splits[split] = to_windows(*sample(rng, n, lengths, width=max_train_len + 1), window, EOS_ID)
  held = {}
  for n_len in range(1, max_eval_len + 1):
    tok, lab = sample(held_rng, heldout_per_length, n_len)
    held[f"tokens_{n_len}"], held[f"labels_{n_len}"] = tok.astype(np.uint8), lab.astype(np.uint8)
  task = {"name": "s5", "generators": [list(g) for g in GENERATOR_PERMS], "num_states": NUM_STATES,
          "max_train_len": max_train_len, "max_eval_len": max_eval_len, "heldout_per_length": heldout_per_length,
          "chance": 1.0 / NUM_STATES, "heldout": "heldout.npz"}
  return datadir.write_labelled_dir(out_dir, splits, tokenizer=TOKENIZER, vocab_size=VOCAB_SIZE, eos_id=EOS_ID,
                                    seed=seed, val_fraction=0.01, extra=task, extra_files={"heldout.npz": held},
                                    force=force)


def load_heldout(data_dir: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
  """{N: (tokens int32 [n, N+1], labels int32 [n, N+1])} of a task data dir's held-out set."""
  manifest = datadir.load_manifest(data_dir)
  name = manifest.get("task", {}).get("heldout")
  if not name:
    raise DataError(f"{data_dir} has no held-out length set (not an S5 task dir); make one with "
                    "python -m nsl.data.tasks.s5 --out=DIR")
  with np.load(os.path.join(data_dir, name)) as z:
    lengths = sorted(int(k.split("_")[1]) for k in z.files if k.startswith("tokens_"))
    return {n: (z[f"tokens_{n}"].astype(np.int32), z[f"labels_{n}"].astype(np.int32)) for n in lengths}


def main(argv=None) -> int:
  p = ArgumentParser(prog="python -m nsl.data.tasks.s5", description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True, help="the task data dir to write")
  p.add_argument("--train_sequences", type=int, default=200_000, help="training sequences to generate")
  p.add_argument("--val_sequences", type=int, default=2_000, help="validation sequences to generate")
  p.add_argument("--max_train_len", type=int, default=16, help="longest training sequence")
  p.add_argument("--heldout_per_length", type=int, default=2_000, help="held-out sequences per length")
  p.add_argument("--max_eval_len", type=int, default=64, help="longest held-out sequence")
  p.add_argument("--seed", type=int, default=0, help="random seed of the sequences")
  p.add_argument("--force", action="store_true", help="rewrite an existing data dir")
  a = p.parse_args(argv)
  m = generate(a.out, a.train_sequences, a.val_sequences, a.max_train_len, a.heldout_per_length, a.max_eval_len,
               a.seed, a.force)
  print(f"s5: wrote {a.out}: {m['splits']['train']['documents']} train sequences, "
        f"held-out N=1..{a.max_eval_len}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(cli_main(main)())
