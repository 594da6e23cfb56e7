"""A small LIFT run on the embedded SOTU corpus (BPE 4096) for smoke tests, like configs/tiny.py.

The teacher defaults to the oracle `labels` teacher (one-hot next tokens); for real teacher
states train configs/tiny.py first and pass --config.lift.teacher=runs/tiny (same tokenizer)."""

from configs import tiny
from nsl.models import lift


def get_config():
  c = tiny.get_config()
  c.family = "lift"
  c.model.variant = "lift"
  c.lift = lift.default_lift_config()
  c.lift.teacher = "labels"
  c.lift.top_k = 256
  c.lift.state_dropout = 0.1
  return c
