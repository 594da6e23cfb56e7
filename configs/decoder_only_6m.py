"""decoder_only at the double-decoder paper's 6m width with its recipe (configs/dd_recipe.py, REFERENCES §2)."""

from configs import dd_recipe


def get_config():
  return dd_recipe.paper("decoder_only", "6m")
