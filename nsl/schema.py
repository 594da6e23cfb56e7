"""Typed option schemas: every config field's type and default, declared once (docs/reference/config.md).

A schema is a dataclass whose fields are one config section's options, each with its type,
default and a comment saying what it does; `nsl.options` mounts each at one place in the config
(the run's sections, the trunk's `Dims` at `config.model`, each family's `Family.options` at
`config.<family>`). This module is the machinery, free of any one schema:

- `section` builds a section's ConfigDict (the base config is only that), every field present,
  a None default a typed placeholder so `--config.X=3` parses as its type;
- `read` gives a section back as its dataclass, a value of the wrong type named in one line, so
  no reader restates a default with `.get(name, default)`;
- `did_you_mean` is the hint of every refused name.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from typing import Any

import ml_collections

from nsl.errors import ConfigError

MISSING_HINT = "start the config from configs/base.py"


@functools.cache
def _hints(schema) -> dict[str, tuple[type, bool, type | None]]:
  """name -> (type, None allowed, element type of a tuple) of each field of `schema`."""
  out = {}
  for name, hint in typing.get_type_hints(schema).items():
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
      hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint) or hint
    element = typing.get_args(hint)[0] if origin is tuple and typing.get_args(hint) else None
    out[name] = (origin, optional, element)
  return out


def field_names(schema) -> tuple[str, ...]:
  return tuple(f.name for f in dataclasses.fields(schema))


def default(schema, name: str) -> Any:
  """The declared default of `schema.name` (dataclasses.MISSING for a required one)."""
  f = next(f for f in dataclasses.fields(schema) if f.name == name)
  if f.default_factory is not dataclasses.MISSING:
    return f.default_factory()
  return f.default


def section(*schemas, **values) -> ml_collections.ConfigDict:
  """A ConfigDict of every field of `schemas` (one section's) at its default (`values` replace
  some; required fields must be given). A None default is a typed placeholder, so `--config.X=3`
  parses as its type."""
  out = ml_collections.ConfigDict()
  for s in schemas:
    for name in field_names(s):
      value = values.pop(name) if name in values else default(s, name)
      if value is dataclasses.MISSING:
        raise TypeError(f"{s.__name__}.{name} has no default; pass it to section()")
      out[name] = entry(s, name, value)
  if values:
    raise TypeError(f"{', '.join(s.__name__ for s in schemas)} has no field {sorted(values)[0]!r}")
  return out


def entry(schema, name: str, value: Any) -> Any:
  """What a ConfigDict holds for `value` of `schema.name`: a typed placeholder for None."""
  kind, optional, _ = _hints(schema)[name]
  if kind is dict:
    return ml_collections.ConfigDict(value)
  return ml_collections.config_dict.placeholder(kind) if value is None and optional else value


def optional(schema, name: str) -> bool:
  """Whether `schema.name` takes None."""
  return _hints(schema)[name][1]


def _what(kind: type) -> str:
  return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
          tuple: "a tuple", dict: "a dict"}.get(kind, kind.__name__)


def coerce(value: Any, schema, name: str, where: str) -> Any:
  """`value` as the declared type of `schema.name` (an int where a float is declared becomes a
  float); ConfigError naming `where` when it is not that type."""
  kind, optional, element = _hints(schema)[name]
  if value is None:
    if optional:
      return None
    raise ConfigError(f"{where}=None must be {_what(kind)}")
  if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
    return float(value)
  if kind is tuple and isinstance(value, (tuple, list)):
    return tuple(element(v) if element in (int, float) else v for v in value)
  if kind is int and isinstance(value, bool) or not isinstance(value, kind):
    raise ConfigError(f"{where}={value!r} must be {_what(kind)}" + (" or None" if optional else ""))
  return value


def read(schema, node, where: str, **given) -> Any:
  """`schema` built from the section `node` mounted at `config.<where>`, each field typed
  (`coerce`); `given` replaces some (`Dims.from_config`'s overrides). Fields of `node` that
  `schema` does not declare are another schema's (`nsl.options.check_known` refuses strays)."""
  values = dict(given)
  for name in field_names(schema):
    if name in values:
      continue
    if node is None or name not in node:
      raise ConfigError(f"config.{where}.{name} is missing; {MISSING_HINT}")
    values[name] = coerce(node[name], schema, name, f"config.{where}.{name}")
  return schema(**values)


def keys(config, prefix: str = "") -> list[str]:
  """Every dotted field name of a ConfigDict or dict (sections and leaves)."""
  out = []
  for k, v in config.items():
    out.append(prefix + k)
    if isinstance(v, (dict, ml_collections.ConfigDict)) and k != "evals":
      out.extend(keys(v, prefix + k + "."))
  return out


def did_you_mean(name: str, known: list[str]) -> str:
  close = difflib.get_close_matches(name, known, n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""
