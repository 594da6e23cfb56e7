"""LIFT and its baselines on S5 and arithmetic (docs/papers/lift.md#definitions): `--config=configs/lift.py:NAME`.

NAME (the leading `lift_` may be left off: `configs/lift.py:s5_oracle` is `lift_s5_oracle`):
  lift_tiny        a small LIFT run on the embedded SOTU corpus for smoke tests (oracle teacher)
  The S5 pipeline (docs/papers/lift.md#results), in order; train each into runs/s5/NAME (`..._seed1`, ...):
  standard_s5      1  the 2-layer standard transformer baseline
  lift_rnn_s5      2  LIFT-RNN (the model's own states fed back sequentially); teacher of 3
  lift_s5          3  LIFT trained in parallel on the LIFT-RNN's states (the paper's 96% / 65%)
  standard_s5_8x   4  the standard model trained 8x longer; the bounded-depth teacher of 5
  lift_s5_bounded  5  LIFT on that bounded-depth teacher
  lift_s5_oracle   6  LIFT on the oracle `labels` teacher: an UPPER BOUND, not the paper's LIFT
  Arithmetic without chain of thought (data/arith, `nsl/data/tasks/arithmetic.py`):
  standard_arith   the standard 2-layer baseline, and the teacher of lift_arith
  lift_arith       LIFT with the trained teacher runs/standard_arith

These replace configs/NAME.py; the old paths still resolve here (configs/aliases.py).
"""

from configs import base, tiny
from nsl.data.tasks import arithmetic
from nsl.models import lift

ARGS = ("lift_tiny", "lift_arith", "lift_s5", "lift_rnn_s5", "lift_s5_bounded", "lift_s5_oracle",
        "standard_s5", "standard_s5_8x", "standard_arith")
S5_TEACHER = "runs/s5/lift_rnn_s5"  # lift_s5's: the LIFT-RNN's own inference states
BOUNDED_TEACHER = "runs/s5/standard_s5_8x"  # lift_s5_bounded's
FUSION_HIDDEN = 102  # 5·d·h + 4d = 7.0% of the model at d = 256 (lift_s5_base)
FACTOR = 8  # standard_s5_8x: the paper's "8x longer training"
STEPS = 400  # every S5 model but standard_s5_8x (FACTOR x STEPS)


def s5_base():
  """S5 state tracking: data generated into data/s5 on first use (or `python -m
  nsl.data.tasks.s5 --out=data/s5`); train lengths N in [1, 16]; one sequence per window, so
  seq_len = 17. Model: 2 layers, d=256, 4 heads, SwiGLU 768: 1.74M parameters (the paper's
  "≈2M"). 400 steps of 128 sequences against the paper's 5,000 (its 8x teacher: 40,000), so
  that the 8x teacher, standard_s5_8x, trains in ≈20 minutes on 2 CPU cores (issue #15's
  budget); raise train.steps for more. Seeds: --config.seed=0/1/2. Evaluate with
  `python -m nsl.evals.length_generalization --runs=...`."""
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
  c.train.steps = STEPS
  c.train.lr = 1e-3
  c.train.warmup_steps = 40
  c.train.decay_steps = 80
  c.train.weight_decay = 0.1
  c.train.log_every = 25
  c.train.eval_every = 200
  c.train.eval_batches = 8
  c.checkpoint.every = 200
  c.checkpoint.keep = 1
  return c


def standard_s5_8x():
  """The paper's standard model solves N <= 6 even with 8x longer training, chance from N = 12."""
  c = s5_base()
  t = c.train
  t.steps, t.decay_steps = FACTOR * t.steps, FACTOR * t.decay_steps
  t.eval_every = t.steps // 4
  c.checkpoint.every = t.steps // 4
  return c


def arith_base():
  """Add and subtract 2–10 one-digit numbers, generated into data/arith on first use; one
  problem per window (seq_len 24); only the answer is trained. Evaluate with
  `python -m nsl.evals.length_generalization --runs=runs/standard_arith,runs/lift_arith`."""
  c = s5_base()
  c.model.vocab_size = 16  # 14 ids, padded
  c.data.path = "data/arith"
  c.data.sources = ("task:arithmetic",)
  c.data.tokenizer = arithmetic.TOKENIZER
  c.data.seq_len = arithmetic.WINDOW
  t = c.train  # the schedule the arithmetic figures (docs/papers/lift.md#results) were measured with
  t.steps, t.warmup_steps, t.decay_steps, t.eval_every = 1500, 100, 300, 500
  c.checkpoint.every = 500
  return c


def lift_s5_base():
  """The S5 LIFT model every LIFT S5 config shares; its teacher is left to the config.

  The trunk of s5_base (2 layers, d = 256, 1.74M parameters) plus the fusion with hidden 102:
  5·256·102 + 4·256 = 0.13M parameters, 7.0% of the 1.87M total — the paper's S5 figure ("≈2M
  parameters, fusion ≈7%"). The generic "≈11d²" (hidden round(2.2 d), lift_tiny) would be 0.72M
  here, 29% of 2.46M: both cannot hold at 2 layers and ≈2M, and the S5-specific statement is the
  one that also keeps LIFT and the standard baseline the same size."""
  c = s5_base()
  c.family = "lift"
  c.model.variant = "lift"
  c.lift = lift.default_lift_config()
  c.lift.top_k = 136  # the whole vocabulary: every state is a full τ-softmax
  c.lift.fusion_hidden = FUSION_HIDDEN
  c.lift.state_dropout = 0.0
  c.lift.adapt_seed = "teacher"
  return c


def lift_s5():
  """Teacher: the LIFT-RNN run of lift_rnn_s5 (`--config.lift.teacher=runs/s5/lift_rnn_s5_seed1`
  for another seed's). Its states are the ones it produces at inference, its own states fed back
  token by token with its KV cache (`nsl.models.teacher`), computed on the fly (17 sequential
  steps of the frozen teacher per batch). The last 10% of steps are self-state adaptation (no
  KL; the teacher's states seed the first own-state pass: seeded with b, the literal reading, S5
  collapsed to chance from N = 5)."""
  c = lift_s5_base()
  c.lift.teacher = S5_TEACHER
  return c


def lift_rnn_s5():
  """LIFT-RNN (docs/papers/lift.md#variants: solves all training lengths): the model's own states fed back
  sequentially in training (a no-gradient cached pass per batch, exactly inference, then the
  gradient pass on those states). The KL term is to the `labels` teacher: on S5 the label at
  every position is the current permutation, the training target itself, so the KL adds no
  information beyond the targets (a CE at temperature τ that sharpens the states); every state
  this model is fed is its own. T = 17 sequential steps per batch: slower than LIFT."""
  c = lift_s5_base()
  c.model.variant = "lift_rnn"
  c.lift.teacher = "labels"
  c.lift.adapt_fraction = 0.0  # lift_rnn has no teacher phase to adapt from
  return c


def lift_s5_bounded():
  """The paper: LIFT solves N <= 12 and half of N = 16 although its teacher (standard_s5_8x,
  `--config.lift.teacher=runs/s5/standard_s5_8x_seed1` for another seed's) is at chance past
  N = 8. Its states (top-k τ-softmax of its logits, one parallel forward) are computed on the fly."""
  c = lift_s5_base()
  c.lift.teacher = BOUNDED_TEACHER
  return c


def lift_s5_oracle():
  """The `labels` teacher's next state is the one-hot current permutation itself, so the model
  only learns to compose one generator with the state it is fed; no trained teacher could give
  better states. No self-state adaptation (`adapt_fraction = 0`, the setting measured at 100%
  to N = 64). Independent of the other S5 steps."""
  c = lift_s5_base()
  c.lift.teacher = "labels"
  c.lift.adapt_fraction = 0.0
  return c


def lift_arith():
  """The teacher is the standard run of standard_arith (train it first), its states computed
  on the fly; states at the answer positions carry the teacher's digit distributions."""
  c = arith_base()
  c.family = "lift"
  c.model.variant = "lift"
  c.lift = lift.default_lift_config()
  c.lift.teacher = "runs/standard_arith"
  c.lift.top_k = 16
  return c


def lift_tiny():
  """Like configs/tiny.py. The teacher defaults to the oracle `labels` teacher (one-hot next
  tokens); for real teacher states train configs/tiny.py first and pass
  --config.lift.teacher=runs/tiny (same tokenizer)."""
  c = tiny.get_config()
  c.family = "lift"
  c.model.variant = "lift"
  c.lift = lift.default_lift_config()
  c.lift.teacher = "labels"
  c.lift.top_k = 256
  c.lift.state_dropout = 0.1
  return c


def get_config(arg: str):
  return {"lift_tiny": lift_tiny, "lift_arith": lift_arith, "lift_s5": lift_s5, "lift_rnn_s5": lift_rnn_s5,
          "lift_s5_bounded": lift_s5_bounded, "lift_s5_oracle": lift_s5_oracle, "standard_s5": s5_base,
          "standard_s5_8x": standard_s5_8x, "standard_arith": arith_base}[arg]()
