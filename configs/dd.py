"""The double-decoder paper's configs (REFERENCES §2): `--config=configs/dd.py:ARCH_SIZE`.

ARCH (the leading `dd_` may be left off: `configs/dd.py:6m` is `dd_6m`): `dd` (family
double_decoder), `sed` (family sed) or `decoder_only` (family standard with both stacks' layers
in one causal stack). SIZE: `6m 12m 25m 50m 100m` (the paper's recipe, `paper`) or `tiny` (CPU,
`tiny`). These replace configs/{dd,sed,decoder_only}_{size}.py and configs/dd_recipe.py; the old
config paths still resolve here (nsl.config.MOVED).

Paper recipe: widths 6.25M=192, 12.5M=256, 25M=448, 50M=576, 100M=832; heads d/64; 10+5 layers
(6m, 12m) else 8+4 (context:generation = 2:1); sequence 2048; AdamW (0.9, 0.95) eps 1e-8; 5%
warmup then linear decay to 10% of the peak; tuned base LRs DD 0.01, SED 0.004, decoder-only
0.01. Those are μP base LRs (base width 64), and every config here trains with μP:
`model.mup_base_width = 64` (nsl/nn/mup.py: hidden matrices' init std / sqrt(m) and Adam LR
/ m, logits × 1/m, attention q·k/d_head, for m = d_model / 64), so `train.lr` is the base LR at
every width. Set `--config.model.mup_base_width=0` for standard parametrisation.

Our choices where the paper gives no number: GPT-2 tokenizer (vocab padded to 50304; SED 50368
so its 100 sentinels, the top ids, never collide with GPT-2's 50257), 64 sequences per step
(131k tokens), 500M tokens by default (the grid sets the budget), SwiGLU hidden 8d/3 rounded to
a multiple of 64 in the context decoder / decoder-only / SED stacks (12d² per layer, like the
generation decoder's GELU 4d MLP).
"""

from configs import base

SIZES = {  # name: (d_model, total layers, generation / SED-decoder layers)
    "6m": (192, 15, 5),
    "12m": (256, 15, 5),
    "25m": (448, 12, 4),
    "50m": (576, 12, 4),
    "100m": (832, 12, 4),
}
LR = {"dd": 0.01, "sed": 0.004, "decoder_only": 0.01}
FAMILY = {"dd": "double_decoder", "sed": "sed", "decoder_only": "standard"}
VARIANT = {"dd": "random_uniform", "sed": "sed", "decoder_only": "standard"}
SEQ_LEN, BATCH, TOKENS = 2048, 64, 500e6
MUP_BASE_WIDTH = 64  # the paper's μP base width (REFERENCES §2)
SENTINELS = 100
ARCHS = ("dd", "sed", "decoder_only")
ARGS = tuple(f"{a}_{s}" for a in ARCHS for s in ("tiny", *SIZES))


def swiglu_hidden(d: int) -> int:
  return int(64 * round(8 * d / 3 / 64))


def set_schedule(c, steps: int):
  """5% warmup, then linear decay to 10% of the peak over all remaining steps."""
  c.train.steps = int(steps)
  c.train.warmup_steps = max(1, int(round(0.05 * steps)))
  c.train.decay_steps = c.train.steps - c.train.warmup_steps
  c.train.schedule = "wsd"
  c.train.min_lr_ratio = 0.1
  return c


def _family_fields(c, arch: str, gen_layers: int):
  c.family = FAMILY[arch]
  c.model.variant = VARIANT[arch]
  # μP (nsl/nn/mup.py); 0 / None = standard parametrisation. Validated in nsl.config.validate.
  c.model.mup_base_width = MUP_BASE_WIDTH
  if arch in ("dd", "sed"):
    c.model.gen_layers = gen_layers
  if arch == "dd":
    c.model.dd_cross_kv = "shared"
  if arch == "sed":
    c.model.noise_density = 0.15
    c.model.mean_span = 4.0
    c.model.sentinels = SENTINELS
  c.train.lr = LR[arch]
  return c


def paper(arch: str, size: str, tokens: float = TOKENS):
  d, layers, gen = SIZES[size]
  c = base.get_config()
  c.model.d_model = d
  c.model.n_layers = layers
  c.model.n_heads = d // 64
  c.model.d_ff = swiglu_hidden(d)
  c.model.vocab_size = 50368 if arch == "sed" else 50304
  c.model.dtype = "auto"
  c.data.seq_len = SEQ_LEN
  c.data.tokenizer = "gpt2"
  c.data.path = "data/fineweb-edu-gpt2"
  c.data.sources = ("hf:HuggingFaceFW/fineweb-edu:sample-10BT:train",)
  c.data.val_fraction = 0.001
  c.train.batch_size = BATCH
  c.train.b1, c.train.b2, c.train.eps = 0.9, 0.95, 1e-8
  c.train.log_every = 50
  c.train.eval_every = 1000
  c.train.eval_batches = 50
  c.checkpoint.every = 1000
  _family_fields(c, arch, gen)
  return set_schedule(c, round(tokens / (SEQ_LEN * BATCH)))


def tiny(arch: str):
  """CPU-sized: d 128, 2+1 layers, 128 tokens, 16 sequences, on the embedded SOTU corpus (BPE
  4096; SED pads the vocabulary by its 100 sentinels). 200 steps: warmup 10, constant, decay over
  the last 50 (so short runs such as --config.train.steps=60 stay valid). μP at base width 64
  (m = 2) with the paper's base LRs, like the full-size configs. On dd_tiny (`dd.py:tiny`) for
  100 steps that is val NLL 6.41 (the 3e-3 these configs used before, under μP: 6.48), against
  5.87 for standard parametrisation at 3e-3 (`--config.model.mup_base_width=0 --config.train.lr=3e-3`, the old
  tiny): μP at the base LR is slower early at this scale."""
  c = base.get_config()
  c.model.d_model = 128
  c.model.n_layers = 3
  c.model.n_heads = 2
  c.model.d_ff = swiglu_hidden(128)
  c.model.vocab_size = 4096 + (128 if arch == "sed" else 0)
  c.data.seq_len = 128
  c.train.batch_size = 16
  c.train.eval_every = 100
  c.checkpoint.every = 100
  _family_fields(c, arch, 1)
  c.train.steps, c.train.warmup_steps, c.train.decay_steps = 200, 10, 50  # fits --config.train.steps=60
  return c


def get_config(arg: str):
  arch, size = arg.rsplit("_", 1)
  return tiny(arch) if size == "tiny" else paper(arch, size)
