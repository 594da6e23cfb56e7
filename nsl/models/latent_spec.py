"""The options of the latent families (nsl/models/nextlat.py: NextLat, its GPT baseline, MTP) in
one home, the LiftSpec pattern (issue #18): each option's default declared here beside it, read
from the config once (`from_config`) and checked there, so no config file carries defaults and
no family reads a field with its own `.get(field, default)`.

Where they live in a config is unchanged (a new option, such as `latent`, is written into every
nextlat config by `nextlat_section` and so changes those configs' grid run ids):
`config.model.nextlat` (docs/papers/nextlat.md#losses: loss weights λ_h, λ_KL, rollout horizon d, dynamics MLP
width, self-speculative draft length, whether the latent losses train the embedding fed to p_ψ,
which hidden state is the latent h; the defaults are the authors' code, docs/xcheck/nextlat.md),
`config.model.mtp` (the number of heads d) and `config.data.answer_token` (prompt masking).
"""

from __future__ import annotations

import dataclasses

import ml_collections

from nsl.errors import ConfigError

# NextLat's h (nsl/models/nextlat.py docstring): after the trunk's final RMSNorm (the vector the
# head reads; the default, the authors' code) or the residual stream before it.
LATENTS = ("final_norm", "residual")
NO_PROMPT_MASKING = -1  # data.answer_token: every next-token target counts (plain text)


def answer_token(config) -> int:
  """`data.answer_token` A: targets count only from A on within a document (-1: all of them)."""
  return int(config.data.get("answer_token", NO_PROMPT_MASKING))


def _read(cls, config, name: str, start: str, fill: str):
  """`cls` built from `config.model.<name>`: each field cast to its default's type, unknown fields
  refused; a missing section names the config to `start` from and the helper that `fill`s it."""
  section, where = config.model.get(name), f"model.{name}"
  if section is None:
    raise ConfigError(f"config.{where} is missing; start from {start} or add `c.{where} = {fill}`")
  names = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(section) - set(names))
  if unknown:
    raise ConfigError(f"config.{where}.{unknown[0]} is not an option; the options are {', '.join(names)}")
  defaults, values = cls(), {}
  for name in names:
    if name in section:
      kind = type(getattr(defaults, name))
      try:
        values[name] = kind(section[name])
      except (TypeError, ValueError):
        what = {int: "an integer", float: "a number", bool: "true or false"}.get(kind, kind.__name__)
        raise ConfigError(f"config.{where}.{name}={section[name]!r} must be {what}") from None
  return cls(**values)


def _at_least(where: str, spec, fields: tuple[str, ...], minimum) -> None:
  for name in fields:
    if getattr(spec, name) < minimum:
      raise ConfigError(f"config.{where}.{name}={getattr(spec, name)} must be >= {minimum}")


@dataclasses.dataclass(frozen=True)
class NextLatSpec:
  """`config.model.nextlat` (docs/papers/nextlat.md#losses)."""

  lambda_h: float = 1.0  # weight of L_next-h (the dynamics model's next-hidden-state loss)
  lambda_kl: float = 1.0  # weight of L_KL (the frozen head's read of the predicted states)
  horizon: int = 2  # rollout steps d
  hidden: int = 384  # dynamics MLP width
  draft_len: int = 4  # tokens drafted per self-speculative step (nsl/speculative.py)
  emb_grad: bool = True  # the latent losses also train the token embedding fed to the dynamics model
  latent: str = "final_norm"  # which h: "final_norm" (what the head reads) | "residual" (before the final norm)

  @staticmethod
  def from_config(config) -> "NextLatSpec":
    spec = _read(NextLatSpec, config, "nextlat", "configs/nextlat.py:tiny", "nsl.models.latent_spec.nextlat_section()")
    _at_least("model.nextlat", spec, ("horizon", "hidden", "draft_len"), 1)
    _at_least("model.nextlat", spec, ("lambda_h", "lambda_kl"), 0)
    if spec.latent not in LATENTS:
      raise ConfigError(f"config.model.nextlat.latent={spec.latent!r} must be one of {', '.join(LATENTS)}")
    return spec


@dataclasses.dataclass(frozen=True)
class MTPSpec:
  """`config.model.mtp` (docs/papers/nextlat.md#speculative-decoding): d heads, next token and the d - 1 after it."""

  horizon: int = 2

  @staticmethod
  def from_config(config) -> "MTPSpec":
    spec = _read(MTPSpec, config, "mtp", "configs/nextlat.py:mtp_tiny", "nsl.models.latent_spec.mtp_section(horizon=D)")
    _at_least("model.mtp", spec, ("horizon",), 1)
    return spec


def authors_hidden(d_model: int, proj_factor: float = 0.5) -> int:
  """The authors' dynamics MLP width: 128 · round(proj_factor · 2d / 128) (Python's round, so
  half-way cases go to even), at least 128. proj_factor 0.5 gives the paper's 384 at d = 384."""
  return max(128, 128 * round(proj_factor * 2 * d_model / 128))


def authors_d_ff(d_model: int) -> int:
  """The authors' SwiGLU width (their models/model_gpt.py MLP): 128 · round(8d/3 / 128), at least 128."""
  return max(128, 128 * round(8 * d_model / 3 / 128))


def nextlat_section(**options) -> ml_collections.ConfigDict:
  """`config.model.nextlat` with every option: the defaults above, `options` changing some."""
  return ml_collections.ConfigDict(dataclasses.asdict(NextLatSpec(**options)))


def mtp_section(**options) -> ml_collections.ConfigDict:
  """`config.model.mtp` with every option."""
  return ml_collections.ConfigDict(dataclasses.asdict(MTPSpec(**options)))
