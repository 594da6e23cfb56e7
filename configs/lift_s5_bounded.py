"""S5 with LIFT trained on a bounded-depth teacher (REFERENCES §3 / the paper: LIFT solves N <= 12
and half of N = 16 although its teacher is at chance past N = 8). Step 5 of the S5 pipeline
(README "LIFT").

Teacher: the 2-layer standard transformer trained 8x longer, configs/standard_s5_8x.py, trained
first into `runs/s5/standard_s5_8x` (`--config.lift.teacher=runs/s5/standard_s5_8x_seed1` for
another seed's); its states (top-k τ-softmax of its logits, one parallel forward) are computed on
the fly. Otherwise configs/lift_s5.py.
"""

from configs import lift_s5

TEACHER = "runs/s5/standard_s5_8x"


def get_config():
  c = lift_s5.lift_s5_base()
  c.lift.teacher = TEACHER
  return c
