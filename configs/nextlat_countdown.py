"""NextLat on countdown at CPU scale (REFERENCES §4: paper 12L/12H/768d, λ_h = 2, λ_KL = 1, MLP
hidden 768, LR 3e-4, 500k problems; here 4L/4H/128d on 50k problems). 36-token documents,
integer tokens (vocab 10_011 padded to 10_048), prompt (numbers, target, 8 pauses, '|') masked.

  python -m nsl.launch --config=configs/nextlat_countdown.py --workdir=runs/nextlat_countdown
  python -m nsl.evals.planning --workdir=runs/nextlat_countdown --limit=500
"""

import ml_collections

from configs import base
from configs.nextlat_tiny import nextlat_section

N_TRAIN, N_TEST = 50_000, 1_000


def countdown_data(c: ml_collections.ConfigDict, n_train: int = N_TRAIN, n_test: int = N_TEST,
                   seed: int = 0) -> ml_collections.ConfigDict:
  from nsl.data.tasks import countdown

  task = countdown.Countdown(n_train=n_train, n_test=n_test, seed=seed)
  c.data.sources = (f"task:countdown:n_train={n_train},n_test={n_test},seed={seed}",)
  c.data.path = f"data/countdown_n{n_train}_s{seed}"
  c.data.tokenizer = "byte"  # unused for task sources
  c.data.seq_len = task.doc_len - 1
  c.data.answer_token = countdown.ANSWER
  c.model.vocab_size = 10_048
  c.model.d_model = 128
  c.model.n_layers = 4
  c.model.n_heads = 4
  c.model.d_ff = 384
  c.train.batch_size = 64
  c.train.steps = 3000
  c.train.lr = 1e-3
  c.train.warmup_steps = 100
  c.train.decay_steps = 600
  c.train.log_every = 50
  c.train.eval_every = 1000
  c.train.eval_batches = 4
  c.checkpoint.every = 1000
  return c


def get_config():
  c = countdown_data(base.get_config())
  c.family = "nextlat"
  c.model.variant = "nextlat"
  c.model.nextlat = nextlat_section(lambda_h=2.0, lambda_kl=1.0, horizon=1, hidden=256, draft_len=4)
  return c
