"""sed at the double-decoder paper's 25m width with its recipe (configs/dd_recipe.py, REFERENCES §2)."""

from configs import dd_recipe


def get_config():
  return dd_recipe.paper("sed", "25m")
