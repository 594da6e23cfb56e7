"""Tiny delayed_state on the embedded SOTU corpus (CPU): configs/sps_tiny.py with variant 'delayed_state'."""

from configs import sps_tiny


def get_config():
  return sps_tiny.variant_config("delayed_state")
