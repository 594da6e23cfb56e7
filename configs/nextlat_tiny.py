"""NextLat on the demo corpus (configs/tiny.py sizes): the latent dynamics model with a d=2 rollout."""

import ml_collections

from configs import tiny


def nextlat_section(lambda_h=1.0, lambda_kl=1.0, horizon=2, hidden=384, draft_len=4, emb_grad=False):
  """config.model.nextlat (REFERENCES §4): loss weights, rollout horizon d, dynamics MLP width,
  self-speculative draft length."""
  n = ml_collections.ConfigDict()
  n.lambda_h = lambda_h
  n.lambda_kl = lambda_kl
  n.horizon = horizon
  n.hidden = hidden
  n.draft_len = draft_len
  n.emb_grad = emb_grad  # L_next-h also trains the (tied) token embedding fed to the dynamics model
  return n


def get_config():
  c = tiny.get_config()
  c.family = "nextlat"
  c.model.variant = "nextlat"
  c.model.nextlat = nextlat_section(hidden=2 * c.model.d_model)
  c.data.answer_token = -1  # plain text: no prompt masking
  return c
