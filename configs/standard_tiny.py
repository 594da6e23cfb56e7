"""Tiny standard transformer with the same model, data and schedule as configs/sps_tiny.py: the
baseline the tiny SPS variants are compared against (family "standard", full causal attention)."""

from configs import sps_tiny


def get_config():
  return sps_tiny.variant_config("standard", family="standard")
