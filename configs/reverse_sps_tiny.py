"""Tiny reverse_sps on the embedded SOTU corpus (CPU): configs/sps_tiny.py with variant 'reverse_sps'."""

from configs import sps_tiny


def get_config():
  return sps_tiny.variant_config("reverse_sps")
