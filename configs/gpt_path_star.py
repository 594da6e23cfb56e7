"""The GPT baseline on path-star G_{2,5}: configs/nextlat_path_star.py without the dynamics
model (family nextlat, variant gpt: same trunk, prompt masking, steps and data).

  python -m nsl.launch --config=configs/gpt_path_star.py --workdir=runs/gpt_path_star
"""

from configs import nextlat_path_star


def get_config():
  c = nextlat_path_star.get_config()
  c.model.variant = "gpt"
  return c
