"""The MTP baseline on the demo corpus: d = 4 heads on the shared trunk (REFERENCES §4 baselines)."""

import ml_collections

from configs import tiny


def get_config():
  c = tiny.get_config()
  c.family = "mtp"
  c.model.variant = "mtp"
  c.model.mtp = ml_collections.ConfigDict()
  c.model.mtp.horizon = 4
  c.data.answer_token = -1
  return c
