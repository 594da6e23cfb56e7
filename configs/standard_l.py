"""Standard transformer, size L of the SPS ladder, with the paper's recipe (REFERENCES §1)."""

from configs import base


def get_config():
  return base.paper_recipe(base.get_config(), "l")
