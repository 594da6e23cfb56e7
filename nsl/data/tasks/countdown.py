"""Countdown (docs/papers/nextlat.md#tasks; Gandhi et al. 2024 format).

Given 4 numbers and a target, combine the numbers with + - * / (each used once, intermediate
results positive integers) to reach the target. Problems are generated backwards (random
operations on random numbers in [1, max_num]); every problem is solver-verified (`solve`) and
the answer checker (`check_solution`) accepts any correct solution, not only the reference.

Token layout (vocab 10_011): every integer 0..10_000 is one token (its own id), then
  10001 ','   10002 '|' (answer marker)   10003 '+'   10004 '-'   10005 '*'   10006 '/'
  10007 '='   10008 <pause>   10009 EOS   10010 PAD

One document (36 tokens; the example of docs/papers/nextlat.md#tasks, `14,83,88,91,23 | 83-14=69, 91-88=3, 69/3=23`):

  n1 , n2 , n3 , n4 , target <pause>×8 | a op b = c , a op b = c , a op b = c EOS
  \\___________________ prompt (18 tokens) ________/ \\_________ target (18) _________/

The prompt (numbers, target, 8 pause tokens, '|') is loss-masked (`data.answer_token = 10002`).
Held-out targets: a fixed 10% of the targets in [min_target, max_target] (chosen by `seed`)
never occur in training; the test set consists of problems with held-out targets only.

  python -m nsl.data.tasks.countdown --n_train=50000 --n_test=1000 --out=DIR
"""

from __future__ import annotations

import dataclasses
import itertools
import sys

import numpy as np

from nsl.data.tasks import planning_dir

MAX_INT = 10_000
COMMA, ANSWER, PLUS, MINUS, TIMES, DIV, EQ, PAUSE, EOS, PAD = range(MAX_INT + 1, MAX_INT + 11)
VOCAB_SIZE = PAD + 1
OPS = {PLUS: "+", MINUS: "-", TIMES: "*", DIV: "/"}
NUM_PAUSE = 8
NUM_INPUTS = 4


def apply_op(op: int, a: int, b: int) -> int | None:
  """a op b as a positive integer <= MAX_INT, or None when not allowed."""
  if op == PLUS:
    r = a + b
  elif op == MINUS:
    r = a - b
  elif op == TIMES:
    r = a * b
  elif op == DIV:
    if b == 0 or a % b:
      return None
    r = a // b
  else:
    return None
  return r if 0 < r <= MAX_INT else None


def solve(numbers, target: int):
  """A list of (a, op, b, c) steps reaching `target` using every number once, or None."""
  numbers = list(numbers)
  if len(numbers) == 1:
    return [] if numbers[0] == target else None
  for i, j in itertools.permutations(range(len(numbers)), 2):
    rest = [numbers[k] for k in range(len(numbers)) if k not in (i, j)]
    for op in OPS:
      c = apply_op(op, numbers[i], numbers[j])
      if c is None:
        continue
      tail = solve(rest + [c], target)
      if tail is not None:
        return [(numbers[i], op, numbers[j], c)] + tail
  return None


def check_solution(numbers, target: int, tokens) -> bool:
  """True iff `tokens` (the generated answer, EOS/PAD-terminated or not) is a correct solution:
  NUM_INPUTS-1 equations `a op b = c` separated by ',', each using two available numbers
  (consumed) and adding c, ending with the target alone."""
  toks = [int(t) for t in tokens]
  for stop in (EOS, PAD):
    if stop in toks:
      toks = toks[: toks.index(stop)]
  pool = list(numbers)
  steps = NUM_INPUTS - 1
  if len(toks) != steps * 6 - 1:
    return False
  for s in range(steps):
    a, op, b, eq, c = toks[s * 6: s * 6 + 5]
    if s < steps - 1 and toks[s * 6 + 5] != COMMA:
      return False
    if op not in OPS or eq != EQ or max(a, b, c) > MAX_INT:
      return False
    if apply_op(op, a, b) != c:
      return False
    for x in (a, b):
      if x not in pool:
        return False
      pool.remove(x)
    pool.append(c)
  return pool == [target]


def solution_tokens(steps) -> list[int]:
  out = []
  for k, (a, op, b, c) in enumerate(steps):
    out += [a, op, b, EQ, c] + ([COMMA] if k < len(steps) - 1 else [])
  return out


@dataclasses.dataclass(frozen=True)
class Countdown(planning_dir.PlanningTask, name="countdown", vocab_size=VOCAB_SIZE, eos_id=EOS, answer_token=ANSWER):
  n_train: int = 50_000
  n_test: int = 1_000
  max_num: int = 99
  min_target: int = 10
  max_target: int = 100
  seed: int = 0

  def tokenizer_spec(self) -> dict:
    return {"integers": MAX_INT + 1, "comma": COMMA, "answer": ANSWER, "ops": {str(k): v for k, v in OPS.items()},
            "eq": EQ, "pause": PAUSE, "eos": EOS, "pad": PAD}

  @property
  def prompt_len(self) -> int:
    return 2 * NUM_INPUTS + 1 + NUM_PAUSE + 1

  @property
  def doc_len(self) -> int:
    return self.prompt_len + (NUM_INPUTS - 1) * 6 - 1 + 1

  def heldout_targets(self) -> np.ndarray:
    targets = np.arange(self.min_target, self.max_target + 1)
    rng = np.random.default_rng([self.seed, 1])
    k = max(1, int(round(0.1 * targets.size)))
    return np.sort(rng.choice(targets, k, replace=False))

  def prompt(self, numbers, target) -> list[int]:
    out = []
    for x in numbers:
      out += [int(x), COMMA]
    return out + [int(target)] + [PAUSE] * NUM_PAUSE + [ANSWER]

  def _sample_one(self, rng: np.random.Generator, want_heldout: bool, heldout: set):
    while True:
      numbers = [int(x) for x in rng.integers(1, self.max_num + 1, NUM_INPUTS)]
      pool, steps = list(numbers), []
      ok = True
      for _ in range(NUM_INPUTS - 1):
        i, j = rng.choice(len(pool), 2, replace=False)
        op = int(rng.choice(list(OPS)))
        a, b = pool[i], pool[j]
        if op in (MINUS, DIV) and a < b:
          a, b = b, a
        c = apply_op(op, a, b)
        if c is None:
          ok = False
          break
        pool = [pool[k] for k in range(len(pool)) if k not in (i, j)] + [c]
        steps.append((a, op, b, c))
      if not ok:
        continue
      target = pool[0]
      if not self.min_target <= target <= self.max_target or (target in heldout) != want_heldout:
        continue
      return numbers, target, steps

  def generate(self):
    """(train docs, test docs, test prompts, test reference answers); all solver-verified."""
    rng = np.random.default_rng(self.seed)
    heldout = set(int(t) for t in self.heldout_targets())
    sets = []
    for n, want in ((self.n_train, False), (self.n_test, True)):
      docs = np.empty((n, self.doc_len), np.int32)
      for r in range(n):
        numbers, target, steps = self._sample_one(rng, want, heldout)
        assert solve(numbers, target) is not None
        docs[r] = self.prompt(numbers, target) + solution_tokens(steps) + [EOS]
      sets.append(docs)
    train, test = sets
    return train, test, test[:, : self.prompt_len].copy(), test[:, self.prompt_len:].copy()

  def numbers_target(self, prompt) -> tuple[list[int], int]:
    p = [int(t) for t in prompt if t != PAD]
    return p[0: 2 * NUM_INPUTS: 2], p[2 * NUM_INPUTS]

  def is_correct(self, prompt, output, answer) -> bool:
    numbers, target = self.numbers_target(prompt)
    return check_solution(numbers, target, output)

  def answer_len(self) -> int:
    return self.doc_len - self.prompt_len

  def decode(self, ids) -> str:
    names = {COMMA: ",", ANSWER: "|", EQ: "=", PAUSE: "<pause>", EOS: "<eos>", PAD: "<pad>", **OPS}
    return " ".join(names.get(int(i), str(int(i))) for i in ids)


def from_kwargs(**kwargs) -> Countdown:
  return Countdown(**kwargs)


def main(argv=None) -> int:
  return planning_dir.task_main("countdown", Countdown, {"n_train": 50_000, "n_test": 1_000, "max_num": 99, "seed": 0}, argv)


if __name__ == "__main__":
  sys.exit(main())
