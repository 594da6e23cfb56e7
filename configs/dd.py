"""The double-decoder paper's configs (docs/papers/double_decoder.md#definitions): `--config=configs/dd.py:ARCH_SIZE`.

ARCH (the leading `dd_` may be left off: `configs/dd.py:6m` is `dd_6m`): `dd` (family
double_decoder), `sed` (family sed) or `decoder_only` (family standard with both stacks' layers
in one causal stack). SIZE: `6m 12m 25m 50m 100m` (the paper's recipe, `paper`) or `tiny` (CPU,
`tiny`). These replace configs/{dd,sed,decoder_only}_{size}.py and configs/dd_recipe.py; the old
config paths still resolve here (configs/aliases.py).

Paper recipe: widths 6.25M=192, 12.5M=256, 25M=448, 50M=576, 100M=832; heads d/64; 10+5 layers
(6m, 12m) else 8+4 (context:generation = 2:1); SED has the same encoder and 3/4 of the decoder
layers (its decoder layers carry cross attention: 8+3, 10+3); sequence 2048; AdamW (0.9, 0.95)
eps 1e-8, weight decay 0.5 (the authors' tuned value for all three, their wd_tuned.json); 5%
warmup then linear decay to 10% of the peak; tuned base LRs DD 0.01, SED 0.004, decoder-only
0.01. Those are μP base LRs (base width 64), and every config here trains with μP:
`model.mup_base_width = 64` (nsl/nn/mup.py: hidden matrices' Adam LR / m, logits × 1/sqrt(m),
attention q·k·sqrt(64)/d_head, for m = d_model / 64), so `train.lr` is the base LR at every
width. Set `--config.model.mup_base_width=0` for standard parametrisation.

The trunk is the authors' (their code, cross-checked in docs/xcheck/dd.md): GELU-tanh MLP of 4d
(`model.mlp`), pre-RMSNorm blocks with torch's RMSNorm eps (float32 machine epsilon), a final
LayerNorm (`model.final_norm`), xavier-uniform init with gain sqrt(2) on every matrix including
the tied embedding (`model.init`), and attention that crosses document boundaries in a packed
row (`model.document_mask=False`; the loss still skips the target after an EOS, as their
collator masks labels at BOS/EOS inputs). The earlier nsl reading (SwiGLU 8d/3, RMSNorm, normal
0.02/sqrt(m), documents masked, logits × 1/m, q·k/d_head) is one override each away.

Our choices where the paper gives no number or its data is not ours: GPT-2 tokenizer (vocab
padded to 50304; SED 50368 so its 100 sentinels, the top ids, never collide with GPT-2's 50257)
on FineWeb-Edu (theirs: a 32k BPE on SlimPajama), 64 sequences per step (131k tokens; theirs
adapts the batch to the cell, 96-512 sequences), 500M tokens by default (the grid sets the
budget).
"""

from configs import base

SIZES = {  # name: (d_model, total layers, generation layers) of DD and decoder-only
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
MUP_BASE_WIDTH = 64  # the paper's μP base width (docs/papers/double_decoder.md#training)
MUP_BASE_HEAD_DIM = 64  # their MUP_BASE_HEAD_DIM: the head size at the base width
WEIGHT_DECAY = 0.5  # their wd_tuned.json, all three architectures
TORCH_RMSNORM_EPS = 1.1920928955078125e-07  # torch.nn.RMSNorm(eps=None): float32 machine epsilon
SENTINELS = 100
ARCHS = ("dd", "sed", "decoder_only")
ARGS = tuple(f"{a}_{s}" for a in ARCHS for s in ("tiny", *SIZES))


def swiglu_hidden(d: int) -> int:
  """SwiGLU hidden 8d/3 rounded to 64 (12d² per layer like a 4d GELU MLP): the earlier reading."""
  return int(64 * round(8 * d / 3 / 64))


def sed_decoder_layers(gen_layers: int) -> int:
  """The authors' SED decoder depth: 3/4 of DD's generation layers (16d² per layer against 12d²)."""
  return max(1, (gen_layers * 3) // 4)


def authors_trunk(c):
  """The authors' trunk (module docstring); d_ff = 4d is set with the width."""
  c.model.mlp = "gelu"
  c.model.d_ff = 4 * c.model.d_model
  c.model.final_norm = "layernorm"
  c.model.init = "xavier_uniform"
  c.model.document_mask = False
  c.model.norm_eps = TORCH_RMSNORM_EPS
  c.model.mup_base_head_dim = MUP_BASE_HEAD_DIM
  c.model.mup_readout = "sqrt"
  return c


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
  authors_trunk(c)
  c.train.weight_decay = WEIGHT_DECAY
  if arch == "dd":
    c.double_decoder.gen_layers = gen_layers
    c.double_decoder.cross_kv = "shared"
  if arch == "sed":  # encoder as DD's context decoder, 3/4 of its generation layers
    c.sed.gen_layers = sed_decoder_layers(gen_layers)
    c.model.n_layers = c.model.n_layers - gen_layers + c.sed.gen_layers
    c.sed.cross_rope = True
    c.sed.noise_density = 0.15
    c.sed.mean_span = 4.0
    c.sed.sentinels = SENTINELS
  c.train.lr = LR[arch]
  return c


def paper(arch: str, size: str, tokens: float = TOKENS):
  d, layers, gen = SIZES[size]
  c = base.get_config()
  c.model.d_model = d
  c.model.n_layers = layers
  c.model.n_heads = d // 64
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
  (m = 2) with the paper's base LRs and the authors' trunk, like the full-size configs."""
  c = base.get_config()
  c.model.d_model = 128
  c.model.n_layers = 3
  c.model.n_heads = 2
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
