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
  c.train.steps = 300  # 1.2M tokens: minutes on 2 cores, well below the corpus's unigram entropy
  c.train.warmup_steps = 20
  c.train.decay_steps = 60
  c.train.lr = 3e-3
  c.train.eval_every = 100
  c.checkpoint.every = 100
  return c
