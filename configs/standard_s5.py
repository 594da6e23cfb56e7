"""S5 state tracking (REFERENCES §3): the 2-layer standard transformer baseline.

Step 1 of the S5 pipeline (README "LIFT"). Data: generated into data/s5 on first use (or
`python -m nsl.data.tasks.s5 --out=data/s5`); train lengths N in [1, 16]; one sequence per
window, so seq_len = 17. Evaluate with `python -m nsl.evals.length_generalization --runs=...`.
Model: 2 layers, d=256, 4 heads, SwiGLU 768: 1.74M parameters (the paper's "≈2M"). Fewer steps
than the paper (5,000) so a model trains in minutes on 2 CPU cores; raise train.steps for more.
Seeds: --config.seed=0/1/2.
"""

from configs import base


def s5_base():
  c = base.get_config()
  c.model.vocab_size = 136  # 120 states + 12 generators + EOS, padded
  c.model.d_model = 256
  c.model.n_layers = 2
  c.model.n_heads = 4
  c.model.d_ff = 768
  c.data.path = "data/s5"
  c.data.sources = ("task:s5",)
  c.data.tokenizer = "task:s5"
  c.data.val_fraction = 0.01
  c.data.seq_len = 17
  c.train.batch_size = 128
  c.train.steps = 1500
  c.train.lr = 1e-3
  c.train.warmup_steps = 100
  c.train.decay_steps = 300
  c.train.weight_decay = 0.1
  c.train.log_every = 50
  c.train.eval_every = 500
  c.train.eval_batches = 8
  c.checkpoint.every = 500
  c.checkpoint.keep = 1
  return c


def get_config():
  return s5_base()
