"""The MTP baseline on path-star (REFERENCES §4 baselines): configs/nextlat_path_star.py's data,
trunk, prompt masking and schedule, with d = 2 heads (next token and the one after) instead of
the dynamics model.

  python -m nsl.launch --config=configs/mtp_path_star.py --workdir=runs/mtp_path_star
  python -m nsl.evals.planning --workdir=runs/mtp_path_star
"""

import ml_collections

from configs import nextlat_path_star


def get_config():
  c = nextlat_path_star.get_config()
  c.family = "mtp"
  c.model.variant = "mtp"
  del c.model["nextlat"]
  c.model.mtp = ml_collections.ConfigDict({"horizon": 2})
  return c
