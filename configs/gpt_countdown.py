"""The GPT baseline on countdown: configs/nextlat_countdown.py without the dynamics model."""

from configs import nextlat_countdown


def get_config():
  c = nextlat_countdown.get_config()
  c.model.variant = "gpt"
  return c
