"""2x memory (SPS with every ρ persistent, i.e. w >= T; logits from ρ), size XL of the ladder,
with the paper's recipe (REFERENCES §1: 4096 tokens = 8192 slots, batch 96, 20B tokens)."""

from configs import base


def get_config():
  c = base.paper_recipe(base.get_config(), "xl")
  c.family = "sps"
  c.model.variant = "twox_memory"
  c.model.window = None
  c.model.layout = "stream_major"  # same losses as "interleaved", faster even without a temporary band
  return c
