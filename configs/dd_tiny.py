"""Tiny dd for CPU runs: the same model shape and data as the other *_tiny configs of
configs/dd_recipe.py (d 128, 2+1 layers, 128 tokens)."""

from configs import dd_recipe


def get_config():
  return dd_recipe.tiny("dd")
