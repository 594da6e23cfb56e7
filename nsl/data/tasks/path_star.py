"""Path-star graphs G_{d,ℓ} (Bachmann & Nagarajan 2024; docs/papers/nextlat.md#tasks).

A centre node with d arms of ℓ-1 nodes each; node labels are d(ℓ-1)+1 distinct values drawn
from 100. The task: given the (shuffled, directed outward) edge list, the start (the centre)
and the goal (the leaf of one arm), output the path from start to goal (ℓ nodes).

Token layout (vocab 105):
  0..99   node labels
  100 '|' edge separator      101 '/' query marker      102 '=' answer marker
  103 EOS                      104 PAD (unused here: every document has the same length)

One document (E = d(ℓ-1) edges, length 3E + ℓ + 4 tokens):

  u_1 v_1 | u_2 v_2 | ... | u_E v_E / start goal = p_1 p_2 ... p_ℓ EOS
  \\________________________ prompt __________________________/ \\__ target __/

The prompt ends with '=' (`ANSWER`); the target is the path p_1 = start, ..., p_ℓ = goal, then
EOS. Only targets after '=' are trained (prompt loss-masked, `data.answer_token = 102`).
Accuracy = exact match of the ℓ greedy-decoded path tokens.

Training and test sets are fixed by `seed`: n_train + n_test graphs drawn at once; test graphs
that repeat a training prompt are dropped (and replaced). G_{5,5}: E = 20, 69 tokens, so
`data.seq_len = 68`.

  python -m nsl.data.tasks.path_star --d=5 --l=5 --n_train=200000 --n_test=20000 --out=DIR
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from nsl.data.tasks import planning_dir

NUM_LABELS = 100
SEP, QUERY, ANSWER, EOS, PAD = 100, 101, 102, 103, 104
VOCAB_SIZE = 105


@dataclasses.dataclass(frozen=True)
class PathStar(planning_dir.PlanningTask, name="path_star", vocab_size=VOCAB_SIZE, eos_id=EOS, answer_token=ANSWER):
  d: int = 5
  l: int = 5
  n_train: int = 200_000
  n_test: int = 20_000
  seed: int = 0

  def __post_init__(self):
    from nsl.errors import ConfigError

    if self.d < 2 or self.l < 2:
      raise ConfigError(f"path_star needs d >= 2 and l >= 2 (got d={self.d}, l={self.l})")
    if self.d * (self.l - 1) + 1 > NUM_LABELS:
      raise ConfigError(f"path_star G_{{{self.d},{self.l}}} has more nodes than {NUM_LABELS} labels")
    if self.n_train < 1 or self.n_test < 1:
      raise ConfigError("path_star needs n_train >= 1 and n_test >= 1")

  def tokenizer_spec(self) -> dict:
    return {"labels": NUM_LABELS, "sep": SEP, "query": QUERY, "answer": ANSWER, "eos": EOS, "pad": PAD}

  @property
  def num_edges(self) -> int:
    return self.d * (self.l - 1)

  @property
  def prompt_len(self) -> int:
    return 3 * self.num_edges - 1 + 4  # edges with separators, '/', start, goal, '='

  @property
  def doc_len(self) -> int:
    return self.prompt_len + self.l + 1

  def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """n problems: prompts [n, prompt_len] and paths [n, l] (int32)."""
    d, arm = self.d, self.l - 1
    labels = np.argsort(rng.random((n, NUM_LABELS)), axis=1)[:, : d * arm + 1].astype(np.int32)
    centre, arms = labels[:, 0], labels[:, 1:].reshape(n, d, arm)
    parents = np.concatenate([np.broadcast_to(centre[:, None, None], (n, d, 1)), arms[:, :, :-1]], axis=2)
    edges = np.stack([parents, arms], axis=-1).reshape(n, d * arm, 2)  # [n, E, 2]
    order = np.argsort(rng.random((n, d * arm)), axis=1)
    edges = np.take_along_axis(edges, order[:, :, None], axis=1)
    goal_arm = rng.integers(0, d, n)
    paths = np.concatenate([centre[:, None], arms[np.arange(n), goal_arm]], axis=1)
    e = self.num_edges
    prompt = np.empty((n, self.prompt_len), np.int32)
    body = np.concatenate([edges, np.full((n, e, 1), SEP, np.int32)], axis=2).reshape(n, 3 * e)[:, :-1]
    prompt[:, : 3 * e - 1] = body
    prompt[:, 3 * e - 1] = QUERY
    prompt[:, 3 * e] = centre
    prompt[:, 3 * e + 1] = paths[:, -1]
    prompt[:, 3 * e + 2] = ANSWER
    return prompt, paths.astype(np.int32)

  def documents(self, prompts: np.ndarray, paths: np.ndarray) -> np.ndarray:
    eos = np.full((prompts.shape[0], 1), EOS, np.int32)
    return np.concatenate([prompts, paths, eos], axis=1)

  def generate(self):
    """(train docs [n_train, L], test docs [n_test, L], test prompts, test paths)."""
    rng = np.random.default_rng(self.seed)
    train_p, train_a = self.sample(self.n_train, rng)
    seen = {row.tobytes() for row in train_p}
    test_p, test_a = [], []
    while sum(len(p) for p in test_p) < self.n_test:
      p, a = self.sample(self.n_test, rng)
      fresh = np.array([row.tobytes() not in seen for row in p], bool)
      test_p.append(p[fresh])
      test_a.append(a[fresh])
    test_p = np.concatenate(test_p)[: self.n_test]
    test_a = np.concatenate(test_a)[: self.n_test]
    return self.documents(train_p, train_a), self.documents(test_p, test_a), test_p, test_a

  def is_correct(self, prompt: np.ndarray, output: np.ndarray, answer: np.ndarray) -> bool:
    """Exact match of the first l generated tokens with the path."""
    return bool(len(output) >= self.l and np.array_equal(np.asarray(output[: self.l]), answer))

  def answer_len(self) -> int:
    return self.l + 1  # the path and EOS

  def decode(self, ids) -> str:
    names = {SEP: "|", QUERY: "/", ANSWER: "=", EOS: "<eos>", PAD: "<pad>"}
    return " ".join(names.get(int(i), str(int(i))) for i in ids)


def from_kwargs(**kwargs) -> PathStar:
  return PathStar(**kwargs)


def main(argv=None) -> int:
  return planning_dir.task_main("path_star", PathStar, {"d": 5, "l": 5, "n_train": 200_000, "n_test": 20_000, "seed": 0}, argv)


if __name__ == "__main__":
  sys.exit(main())
