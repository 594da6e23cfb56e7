"""Tiny SPS on the embedded SOTU corpus: the CPU-sized variant of configs/sps_{xs..xl}.py.

A narrower configs/tiny.py (d 128, 4 layers, 128 tokens = 256 slots) with a window of 16
tokens, 240 steps of 16 sequences: about 1.2 s a step for SPS on 2 busy CPU cores, ~5 minutes a
run. `variant_config` builds the other variants' tiny configs (twox_memory_tiny,
delayed_state_tiny, reverse_sps_tiny, standard_tiny) so all five differ only in the variant.
"""

from configs import base


def variant_config(variant: str, family: str = "sps"):
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
  if family == "sps":  # same losses as "interleaved", faster (nsl.models.sps.DEFAULT_LAYOUT)
    c.model.layout = "stream_major"
  c.data.seq_len = 128
  c.train.batch_size = 16
  c.train.steps = 240
  c.train.warmup_steps = 20
  c.train.decay_steps = 60
  c.train.lr = 3e-3
  c.train.eval_every = 120
  c.checkpoint.every = 120
  return c


def get_config():
  return variant_config("sps")
