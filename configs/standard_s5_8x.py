"""S5: the standard transformer of configs/standard_s5.py trained 8x longer (REFERENCES §3: the
paper's standard model solves N <= 6 even with 8x longer training, chance from N = 12). Step 4 of
the S5 pipeline (README "LIFT"): the bounded-depth teacher of configs/lift_s5_bounded.py, so train
it into `runs/s5/standard_s5_8x` (`..._seed1`, ... for other seeds).
"""

from configs import standard_s5

FACTOR = 8


def get_config():
  c = standard_s5.s5_base()
  t = c.train
  t.steps, t.decay_steps = FACTOR * t.steps, FACTOR * t.decay_steps
  t.eval_every = t.steps // 4
  c.checkpoint.every = t.steps // 4
  return c
