"""Tiny twox_memory on the embedded SOTU corpus (CPU): configs/sps_tiny.py with variant 'twox_memory'."""

from configs import sps_tiny


def get_config():
  return sps_tiny.variant_config("twox_memory")
