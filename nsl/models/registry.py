"""Family name -> Family class. Families are imported lazily so one broken family file does not
take the others down, and describe mode imports only what it needs."""

from __future__ import annotations

import importlib

from nsl.errors import ConfigError

FAMILIES: dict[str, str] = {
    "standard": "nsl.models.transformer:StandardFamily",
    "sps": "nsl.models.sps:SPSFamily",
    "lift": "nsl.models.lift:LiftFamily",
    "nextlat": "nsl.models.nextlat:NextLatFamily",
    "mtp": "nsl.models.nextlat:MTPFamily",
    "double_decoder": "nsl.models.double_decoder:DoubleDecoderFamily",
    "sed": "nsl.models.sed:SEDFamily",
}


def get_family_class(name: str):
  if name not in FAMILIES:
    raise ConfigError(f"config.family={name!r} is unknown; choose one of {sorted(FAMILIES)}")
  module, cls = FAMILIES[name].split(":")
  return getattr(importlib.import_module(module), cls)


def get_family(config):
  """The Family object for a (validated) config."""
  return get_family_class(config.family).create(config)
