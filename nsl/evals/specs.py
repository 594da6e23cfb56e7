"""The shape of `config.evals` and its checks (docs/guide/evaluation.md#evaluators-during-training).

`config.evals` maps an evaluator's name to its spec, a dict with a `kind` and that kind's fields:

  c.evals = {"wiki": {"kind": "nll", "data": "data/wiki-bpe4k", "batches": 4},
             "arc": {"kind": "zeroshot", "task": "arc_easy", "data": "tasks/arc_easy.jsonl", "limit": 200}}

`validate` checks the shape only (names, kinds, fields, types, ranges), so `nsl.config.validate`
can call it where the data is not at hand (a grid listed on a laptop, `nsl.compile`); the files
are checked when the trainer builds the evaluators (`nsl.evals.evaluators.build`). Kept free of
JAX and of the evaluators' modules, which import what imports `nsl.config`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from nsl.errors import ConfigError

REQUIRED = object()
# kind -> field -> (type, default). A default of REQUIRED must be given; "" for a data dir means
# the run's own data (config.data.path); 0 for a count means "all" (or, for nll's batches,
# train.eval_batches). The defaults equal the stand-alone commands' flags.
KINDS: dict[str, dict[str, tuple[type, Any]]] = {
    "nll": {"data": (str, REQUIRED), "split": (str, "val"), "batches": (int, 0)},
    "zeroshot": {"task": (str, REQUIRED), "data": (str, REQUIRED), "limit": (int, 0), "batch_size": (int, 16)},
    "length_generalization": {"data": (str, ""), "lengths": (str, ""), "per_length": (int, 2000),
                              "batch_size": (int, 2000), "view": (str, "own")},
    "planning": {"data": (str, ""), "limit": (int, 0), "batch_size": (int, 250), "temperature": (float, 0.0),
                 "sample_seed": (int, 0)},
}
# Fields that must be >= 1 (the others that are ints must be >= 0).
POSITIVE = {"batch_size", "per_length"}
CHOICES: dict[str, tuple[str, ...]] = {}  # a view is checked by the run's family (`Family.views`)
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _as_dict(value) -> dict | None:
  if hasattr(value, "to_dict"):  # an ml_collections.ConfigDict
    return value.to_dict()
  return dict(value) if isinstance(value, dict) else None


def _check_type(where: str, value, kind: type) -> None:
  if kind is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  elif kind is int:
    ok = isinstance(value, int) and not isinstance(value, bool)
  else:
    ok = isinstance(value, kind)
  if not ok:
    what = {float: "a finite number", int: "an integer", str: "a string"}[kind]
    raise ConfigError(f"{where}={value!r} must be {what}")


def resolve(name: str, spec) -> dict[str, Any]:
  """The spec of evaluator `name` with its defaults filled in; ConfigError naming the field."""
  where = f"config.evals.{name}"
  if not isinstance(name, str) or not NAME.match(name):
    raise ConfigError(f"{where}: an evaluator's name must be letters, digits and _ (starting with a letter); "
                      "it prefixes the logged metrics")
  fields = _as_dict(spec)
  if fields is None:
    raise ConfigError(f"{where} must be a dict with a 'kind' (one of {sorted(KINDS)}), got {spec!r}")
  kind = fields.pop("kind", None)
  if kind not in KINDS:
    raise ConfigError(f"{where}.kind={kind!r} is unknown; choose one of {sorted(KINDS)}")
  allowed = KINDS[kind]
  unknown = sorted(set(fields) - set(allowed))
  if unknown:
    raise ConfigError(f"{where}.{unknown[0]}: not a field of a {kind!r} evaluator; its fields: {sorted(allowed)}")
  out = {"kind": kind}
  for field, (typ, default) in allowed.items():
    value = fields.get(field, default)
    if value is None and default is not REQUIRED:
      value = default  # None (an ml_collections placeholder) reads as the default
    if value is REQUIRED or (default is REQUIRED and value in ("", None)):
      raise ConfigError(f"{where}.{field} is required for a {kind!r} evaluator")
    _check_type(f"{where}.{field}", value, typ)
    if typ is int and value < (1 if field in POSITIVE else 0):
      raise ConfigError(f"{where}.{field}={value} must be >= {1 if field in POSITIVE else 0}")
    if typ is float and value < 0:
      raise ConfigError(f"{where}.{field}={value} must be >= 0")
    if field in CHOICES and value not in CHOICES[field]:
      raise ConfigError(f"{where}.{field}={value!r} must be one of {CHOICES[field]}")
    out[field] = float(value) if typ is float else value
  if kind == "zeroshot":
    from nsl.evals.zeroshot_tasks import READERS

    if out["task"] not in READERS:
      raise ConfigError(f"{where}.task={out['task']!r} is unknown; choose one of {sorted(READERS)}")
  return out


def resolve_all(config) -> dict[str, dict[str, Any]]:
  """{name: resolved spec} of `config.evals` (empty when the config has none: runs from before the field)."""
  evals = config.get("evals") if hasattr(config, "get") else None
  if evals is None:
    return {}
  specs = _as_dict(evals)
  if specs is None:
    raise ConfigError(f"config.evals must be a dict of name -> evaluator spec, got {evals!r}")
  return {name: resolve(name, spec) for name, spec in specs.items()}


def validate(config) -> None:
  resolve_all(config)
