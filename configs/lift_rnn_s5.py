"""S5 with LIFT-RNN (REFERENCES §3: solves all training lengths): the model's own states fed back
sequentially in training (a no-gradient cached pass per batch, exactly inference, then the
gradient pass on those states). Step 2 of the S5 pipeline (README "LIFT"): it is the teacher of
configs/lift_s5.py, so train it into `runs/s5/lift_rnn_s5` (`..._seed1`, ... for other seeds).

The KL term is to the `labels` teacher: on S5 the label at every position is the current
permutation, the training target itself, so the KL adds no information beyond the targets (a
CE at temperature τ that sharpens the states); every state this model is fed is its own.
T = 17 sequential steps per batch: slower than LIFT. Same model as configs/lift_s5.py.
"""

from configs import lift_s5


def get_config():
  c = lift_s5.lift_s5_base()
  c.model.variant = "lift_rnn"
  c.lift.teacher = "labels"
  c.lift.adapt_fraction = 0.0  # lift_rnn has no teacher phase to adapt from
  return c
