"""Arithmetic without chain of thought (REFERENCES §3 procedural evaluation): the standard
2-layer baseline, and the teacher of configs/lift_arith.py.

Data: add and subtract 2–10 one-digit numbers (`nsl/data/tasks/arithmetic.py`), generated into
data/arith on first use; one problem per window (seq_len 24); only the answer is trained.

  python -m nsl.launch --config=configs/standard_arith.py --workdir=runs/standard_arith
  python -m nsl.evals.length_generalization --runs=runs/standard_arith   # exact match by operand count
"""

from configs import standard_s5
from nsl.data.tasks import arithmetic


def arith_base():
  c = standard_s5.s5_base()
  c.model.vocab_size = 16  # 14 ids, padded
  c.data.path = "data/arith"
  c.data.sources = ("task:arithmetic",)
  c.data.tokenizer = arithmetic.TOKENIZER
  c.data.seq_len = arithmetic.WINDOW
  return c


def get_config():
  return arith_base()
