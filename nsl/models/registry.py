"""Family name -> Family class. Families are imported lazily so one broken family file does not
take the others down, and describe mode imports only what it needs."""

from __future__ import annotations

import importlib
from typing import Any

from nsl.errors import ConfigError

FAMILIES: dict[str, Any] = {
    "standard": "nsl.models.transformer:StandardFamily",
    "sps": "nsl.models.sps:SPSFamily",
    "lift": "nsl.models.lift:LiftFamily",
    "nextlat": "nsl.models.nextlat:NextLatFamily",
    "mtp": "nsl.models.nextlat:MTPFamily",
    "double_decoder": "nsl.models.double_decoder:DoubleDecoderFamily",
    "sed": "nsl.models.sed:SEDFamily",
}


def register(name: str, target) -> None:
  """Adds family `name` (`config.family`): `target` a `Family` subclass, or "module:Class" imported
  when first asked for. A family is a plug-in: nothing else names it (docs/design.md#families)."""
  FAMILIES[name] = target


def get_family_class(name: str):
  if name not in FAMILIES:
    raise ConfigError(f"config.family={name!r} is unknown; choose one of {sorted(FAMILIES)}")
  target = FAMILIES[name]
  if not isinstance(target, str):
    return target
  module, cls = target.split(":")
  return getattr(importlib.import_module(module), cls)


def get_family(config):
  """The Family object for a (validated) config."""
  return get_family_class(config.family).create(config)
