"""The shape of `config.evals` and its checks (docs/guide/evaluation.md#evaluators-during-training).

`config.evals` maps an evaluator's name to its spec, a dict with a `kind` and that kind's fields:

  c.evals = {"wiki": {"kind": "nll", "data": "data/wiki-bpe4k", "batches": 4},
             "arc": {"kind": "zeroshot", "task": "arc_easy", "data": "tasks/arc_easy.jsonl", "limit": 200}}

Each kind and its fields are defined once, in `nsl.evals.kinds` (their reference:
docs/reference/evaluators.md); `resolve` turns a spec into an instance of its kind. `validate`
checks the shape only (names, kinds, fields, types, ranges), so `nsl.config.validate` can call it
where the data is not at hand (a grid listed on a laptop, `nsl.compile`); the files are checked
when the trainer builds the evaluators (`nsl.evals.evaluators.build`). Kept free of JAX and of the
evaluators' modules, which import what imports `nsl.config`.
"""

from __future__ import annotations

import math
import re

from nsl import schema
from nsl.errors import ConfigError
from nsl.evals.kinds import KINDS, Kind, Option, options

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _as_dict(value) -> dict | None:
  if hasattr(value, "to_dict"):  # an ml_collections.ConfigDict
    return value.to_dict()
  return dict(value) if isinstance(value, dict) else None


def _did_you_mean(word, known) -> str:
  return schema.did_you_mean(str(word), [str(k) for k in known])


def _field(where: str, kind: str, o: Option, value):
  """The value of field `o` given `value` (absent or None: its default), typed as the config's
  schemas are (`nsl.schema.coerce`); ConfigError naming it."""
  if value is None and not o.required:
    value = o.default  # None (an ml_collections placeholder) reads as the default
  if o.required and value in ("", None):
    raise ConfigError(f"{where} is required for a {kind!r} evaluator")
  value = schema.coerce(value, KINDS[kind], o.name, where)
  if o.type is float and not math.isfinite(value):
    raise ConfigError(f"{where}={value!r} must be a finite number")
  if o.minimum is not None and value < o.minimum:
    raise ConfigError(f"{where}={value} must be >= {o.minimum:g}")
  if o.choices and value not in o.choices:
    raise ConfigError(f"{where}={value!r} is unknown{_did_you_mean(value, o.choices)}; choose one of {list(o.choices)}")
  return value


def resolve(name: str, spec) -> Kind:
  """The spec of evaluator `name` as an instance of its kind (`nsl.evals.kinds`), defaults filled
  in; ConfigError naming the field."""
  where = f"config.evals.{name}"
  if not isinstance(name, str) or not NAME.match(name):
    raise ConfigError(f"{where}: an evaluator's name must be letters, digits and _ (starting with a letter); "
                      "it prefixes the logged metrics")
  fields = _as_dict(spec)
  if fields is None:
    raise ConfigError(f"{where} must be a dict with a 'kind' (one of {sorted(KINDS)}), got {spec!r}")
  kind = fields.pop("kind", None)
  if kind not in KINDS:
    raise ConfigError(f"{where}.kind={kind!r} is unknown{_did_you_mean(kind, KINDS)}; choose one of {sorted(KINDS)}")
  allowed = options(KINDS[kind])
  unknown = sorted(set(fields) - {o.name for o in allowed})
  if unknown:
    raise ConfigError(f"{where}.{unknown[0]}: not a field of a {kind!r} evaluator"
                      f"{_did_you_mean(unknown[0], [o.name for o in allowed])}; its fields: {[o.name for o in allowed]}")
  return KINDS[kind](**{o.name: _field(f"{where}.{o.name}", kind, o, fields.get(o.name)) for o in allowed})


def resolve_all(config) -> dict[str, Kind]:
  """{name: resolved spec} of `config.evals` (the base config's is empty)."""
  evals = config.evals
  specs = _as_dict(evals)
  if specs is None:
    raise ConfigError(f"config.evals must be a dict of name -> evaluator spec, got {evals!r}")
  return {name: resolve(name, spec) for name, spec in specs.items()}


def validate(config) -> None:
  resolve_all(config)
