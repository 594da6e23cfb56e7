"""S5 with LIFT (REFERENCES §3): parallel training on teacher states, own-state feedback at test.

The teacher is the oracle `labels` teacher: its next state is the one-hot current permutation
(S5's targets are the states). The last 10% of steps are self-state adaptation (no teacher).
Same trunk as configs/standard_s5.py plus the fusion layer (5·d·round(2.2d) = 0.72M parameters).
"""

from configs import standard_s5
from nsl.models import lift


def get_config():
  c = standard_s5.s5_base()
  c.family = "lift"
  c.model.variant = "lift"
  c.lift = lift.default_lift_config()
  c.lift.teacher = "labels"
  c.lift.top_k = 136
  c.lift.state_dropout = 0.0
  return c
