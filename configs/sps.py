"""The SPS paper's variants at every size (docs/papers/sps.md#ladder): `--config=configs/sps.py:VARIANT_SIZE`.

VARIANT (the leading `sps_` may be left off: `configs/sps.py:xl` is `sps_xl`):
  standard       the transformer baseline (family "standard")
  sps            x persistent, ρ temporary within w, logits from ρ
  twox_memory    2x memory: every ρ persistent (w >= T), logits from ρ
  delayed_state  ρ persistent, x temporary within w, logits from ρ
  reverse_sps    ρ persistent, x temporary within w, logits from x
SIZE:
  xs s m l xl    the ladder (nsl.config.SIZES) with the paper's recipe (configs/base.py
                 `paper_recipe`: 4096 tokens = 8192 slots, batch 96, 20B tokens), w = 64
  tiny           CPU-sized on the embedded SOTU corpus (`variant_config`), w = 16

These replace configs/<VARIANT>_<SIZE>.py; the old paths still resolve here (configs/aliases.py).
"""

from configs import base, tiny

VARIANTS = ("standard", "sps", "twox_memory", "delayed_state", "reverse_sps")
SIZES = ("tiny", "xs", "s", "m", "l", "xl")
ARGS = tuple(f"{v}_{s}" for v in VARIANTS for s in SIZES)


def authors_init(c):
  """The SPS authors' initialisation (their code, for SPS and standard alike): every matrix
  N(0, init_std), the attention output at init_std/sqrt(2·layers), the SwiGLU down projection NOT
  scaled (their down_proj is not one of nanoGPT's c_proj). nsl's trunk scales both; at sps_tiny the
  cross-check against their code measured the difference (docs/xcheck/sps.md).
  `--config.model.scaled_mlp_out_init=true` gives nsl's earlier init."""
  c.model.scaled_mlp_out_init = False


def variant_config(variant: str, family: str = "sps"):
  """The tiny setting: a narrower configs/tiny.py (d 128, 4 layers; its CPU recipe, 128 tokens =
  256 slots) with a window of 16 tokens, 240 steps of 16 sequences: about 1.2 s a step for SPS
  on 2 busy CPU cores, ~5 minutes a run. All five variants differ only in the variant (and the
  window)."""
  c = base.get_config()
  c.family = family
  c.model.variant = variant
  c.model.d_model = 128
  c.model.n_layers = 4
  c.model.n_heads = 4
  c.model.d_ff = 384
  # BPE 4096 + the <predict> row (id 4096, sps.predict_token_id_of), padded to a multiple of 64;
  # the same for every variant (standard included) so the five differ only in the variant.
  c.model.vocab_size = 4160
  c.model.window = None if variant in ("twox_memory", "standard") else 16
  authors_init(c)
  # Pinned (it is also nsl.models.sps.DEFAULT_LAYOUT): the CPU study's cells ran stream-major,
  # and the grid keys its cells by the config, so a later change of the default cannot re-key them.
  if family == "sps":
    c.sps.layout = "stream_major"
  return tiny.cpu_recipe(c, batch_size=16, steps=240, every=120)


def ladder_config(variant: str, size: str):
  """A ladder size with the paper's recipe; the SPS variants with the temporary window w = 64."""
  c = base.paper_recipe(base.get_config(), size)
  authors_init(c)
  if variant == "standard":
    return c
  c.family = "sps"
  c.model.variant = variant
  c.model.window = None if variant == "twox_memory" else 64
  # Same losses as "interleaved"; the chunked/kernel paths skip more tiles (and stream_major is
  # faster even without a temporary band, for twox_memory).
  c.sps.layout = "stream_major"
  return c


def get_config(arg: str):
  variant, size = arg.rsplit("_", 1)
  if size == "tiny":
    return variant_config(variant, family="standard" if variant == "standard" else "sps")
  return ladder_config(variant, size)
