"""S5 with LIFT trained in parallel on a LIFT-RNN's states (REFERENCES §3: the paper's 96% / 65%
at N = 32 / 64). Step 3 of the S5 pipeline (README "LIFT", the S5 recipe).

Teacher: the LIFT-RNN run of configs/lift_rnn_s5.py, trained first into `runs/s5/lift_rnn_s5`
(`--config.lift.teacher=runs/s5/lift_rnn_s5_seed1` for another seed's). Its states are the ones
it produces at inference, its own states fed back token by token with its KV cache
(`nsl.models.teacher`), computed on the fly (17 sequential steps of the frozen teacher per batch).
The last 10% of steps are self-state adaptation (no KL; the teacher's states seed the first
own-state pass: seeded with b, the literal reading, S5 collapsed to chance from N = 5).

Model: the trunk of configs/standard_s5.py (2 layers, d = 256, 1.74M parameters) plus the fusion
with hidden 102: 5·256·102 + 4·256 = 0.13M parameters, 7.0% of the 1.87M total — the paper's S5
figure ("≈2M parameters, fusion ≈7%"). The generic "≈11d²" (hidden round(2.2 d), `lift_tiny`)
would be 0.72M here, 29% of 2.46M: both cannot hold at 2 layers and ≈2M, and the S5-specific
statement is the one that also keeps LIFT and the standard baseline the same size.
"""

from configs import standard_s5
from nsl.models import lift

TEACHER = "runs/s5/lift_rnn_s5"
FUSION_HIDDEN = 102  # 5·d·h + 4d = 7.0% of the model at d = 256 (docstring)


def lift_s5_base():
  """The S5 LIFT model every LIFT S5 config shares; its teacher is left to the config."""
  c = standard_s5.s5_base()
  c.family = "lift"
  c.model.variant = "lift"
  c.lift = lift.default_lift_config()
  c.lift.top_k = 136  # the whole vocabulary: every state is a full τ-softmax
  c.lift.fusion_hidden = FUSION_HIDDEN
  c.lift.state_dropout = 0.0
  c.lift.adapt_seed = "teacher"
  return c


def get_config():
  c = lift_s5_base()
  c.lift.teacher = TEACHER
  return c
