"""Delayed state (ρ persistent, x temporary within w = 64, logits from ρ), size XL of the ladder,
with the paper's recipe (REFERENCES §1: 4096 tokens = 8192 slots, batch 96, 20B tokens)."""

from configs import base


def get_config():
  c = base.paper_recipe(base.get_config(), "xl")
  c.family = "sps"
  c.model.variant = "delayed_state"
  c.model.window = 64
  c.model.layout = "stream_major"  # same losses as "interleaved"; the chunked/kernel paths skip more tiles
  return c
