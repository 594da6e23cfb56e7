"""S5 with LIFT on the oracle teacher: an UPPER BOUND, not the paper's LIFT (README "LIFT").

The `labels` teacher's next state is the one-hot current permutation itself, so the model only
learns to compose one generator with the state it is fed; no trained teacher could give better
states. No self-state adaptation (`adapt_fraction = 0`, the setting measured at 100% to N = 64).
Same model as configs/lift_s5.py. Step 6 of the S5 pipeline (independent of the others).
"""

from configs import lift_s5


def get_config():
  c = lift_s5.lift_s5_base()
  c.lift.teacher = "labels"
  c.lift.adapt_fraction = 0.0
  return c
