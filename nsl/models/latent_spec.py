"""The options of the latent families (nsl/models/nextlat.py: NextLat, its GPT baseline, MTP): each
a schema (nsl.schema) with its defaults declared beside it, read typed once and checked here.

`config.nextlat` (docs/papers/nextlat.md#losses: loss weights λ_h, λ_KL, rollout horizon d, dynamics MLP
width, self-speculative draft length, whether the latent losses train the embedding fed to p_ψ,
which hidden state is the latent h; the defaults are the authors' code, docs/xcheck/nextlat.md),
`config.mtp` (the number of heads d) and `config.data.answer_token` (prompt masking). Configs
written before these mounts held them at `config.model.nextlat` / `config.model.mtp`
(`Family.legacy`).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from nsl import schema
from nsl.errors import ConfigError

# NextLat's h (nsl/models/nextlat.py docstring): after the trunk's final RMSNorm (the vector the
# head reads; the default, the authors' code) or the residual stream before it.
LATENTS = ("final_norm", "residual")


def answer_token(config) -> int:
  """`data.answer_token` A: targets count only from A on within a document (-1: all of them)."""
  return int(config.data.answer_token)


def _at_least(where: str, spec, fields: tuple[str, ...], minimum) -> None:
  for name in fields:
    if getattr(spec, name) < minimum:
      raise ConfigError(f"config.{where}.{name}={getattr(spec, name)} must be >= {minimum}")


@dataclasses.dataclass(frozen=True)
class NextLatSpec:
  """`config.nextlat` (docs/papers/nextlat.md#losses)."""

  lambda_h: float = 1.0  # weight of L_next-h (the dynamics model's next-hidden-state loss)
  lambda_kl: float = 1.0  # weight of L_KL (the frozen head's read of the predicted states)
  horizon: int = 2  # rollout steps d
  hidden: int = 384  # dynamics MLP width
  draft_len: int = 4  # tokens drafted per self-speculative step (nsl/speculative.py)
  emb_grad: bool = True  # the latent losses also train the token embedding fed to the dynamics model
  latent: str = "final_norm"  # which h: "final_norm" (what the head reads) | "residual" (before the final norm)

  def check(self) -> "NextLatSpec":
    _at_least("nextlat", self, ("horizon", "hidden", "draft_len"), 1)
    _at_least("nextlat", self, ("lambda_h", "lambda_kl"), 0)
    if self.latent not in LATENTS:
      raise ConfigError(f"config.nextlat.latent={self.latent!r} must be one of {', '.join(LATENTS)}")
    return self


@dataclasses.dataclass(frozen=True)
class MTPSpec:
  """`config.mtp` (docs/papers/nextlat.md#speculative-decoding): d heads, next token and the d - 1 after it."""

  horizon: int = 2

  def check(self) -> "MTPSpec":
    _at_least("mtp", self, ("horizon",), 1)
    return self


def authors_hidden(d_model: int, proj_factor: float = 0.5) -> int:
  """The authors' dynamics MLP width: 128 · round(proj_factor · 2d / 128) (Python's round, so
  half-way cases go to even), at least 128. proj_factor 0.5 gives the paper's 384 at d = 384."""
  return max(128, 128 * round(proj_factor * 2 * d_model / 128))


def authors_d_ff(d_model: int) -> int:
  """The authors' SwiGLU width (their models/model_gpt.py MLP): 128 · round(8d/3 / 128), at least 128."""
  return max(128, 128 * round(8 * d_model / 3 / 128))


def nextlat_section(**options) -> ml_collections.ConfigDict:
  """`config.nextlat` with every option: the defaults above, `options` changing some."""
  return schema.section(NextLatSpec, **options)


def mtp_section(**options) -> ml_collections.ConfigDict:
  """`config.mtp` with every option."""
  return schema.section(MTPSpec, **options)
