"""LIFT on arithmetic with a trained teacher (REFERENCES §3): the teacher is the standard run of
configs/standard_arith.py (train it first), its states computed on the fly; states at the
answer positions carry the teacher's digit distributions.

  python -m nsl.launch --config=configs/standard_arith.py --workdir=runs/standard_arith
  python -m nsl.launch --config=configs/lift_arith.py --workdir=runs/lift_arith
  python -m nsl.evals.length_generalization --runs=runs/standard_arith,runs/lift_arith
"""

from configs import standard_arith
from nsl.models import lift


def get_config():
  c = standard_arith.arith_base()
  c.family = "lift"
  c.model.variant = "lift"
  c.lift = lift.default_lift_config()
  c.lift.teacher = "runs/standard_arith"
  c.lift.top_k = 16
  return c
