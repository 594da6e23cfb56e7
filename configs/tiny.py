"""The demo: a 4-layer standard transformer on the embedded SOTU corpus, minutes on 2 CPU cores."""

from configs import base


def get_config():
  c = base.get_config()
  c.model.d_model = 192
  c.model.n_layers = 4
  c.model.n_heads = 4
  c.model.d_ff = 576
  c.data.seq_len = 128
  c.train.batch_size = 32
  c.train.steps = 600
  c.train.warmup_steps = 30
  c.train.decay_steps = 120
  c.train.lr = 3e-3
  c.train.eval_every = 200
  c.checkpoint.every = 200
  return c
