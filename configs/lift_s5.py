"""S5 with LIFT (REFERENCES §3): parallel training on teacher states, own-state feedback at test.

The teacher is the oracle `labels` teacher: its next state is the one-hot current permutation
(S5's targets are the states). The last 10% of steps are self-state adaptation (no KL; the
teacher's states only seed the first own-state pass).
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
  # Adaptation seeded with b (the literal reading) collapsed S5 to chance from N = 5; seeded with
  # the teacher's states it keeps 100% to N = 64 (seed 0, d = 128; README "LIFT").
  c.lift.adapt_seed = "teacher"
  return c
