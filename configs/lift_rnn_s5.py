"""S5 with LIFT-RNN (REFERENCES §3): the model's own states fed back sequentially in training
(a no-gradient cached pass per batch, then the gradient pass on those states) plus the KL to
the oracle `labels` teacher. T = 17 sequential steps per batch: slower than LIFT."""

from configs import lift_s5


def get_config():
  c = lift_s5.get_config()
  c.model.variant = "lift_rnn"
  return c
