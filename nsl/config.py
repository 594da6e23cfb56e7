"""Config loading, CLI overrides, size ladders and validation.

Configs are Python files with `get_config() -> ml_collections.ConfigDict` (configs-as-code).
`load_config(path, overrides)` applies `--config.a.b=value` overrides with the type of the
existing field, and `validate` turns every inconsistent value into a `ConfigError` naming the
field. Family-specific checks live in each family's `validate`.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import os
import sys
from typing import Any, Iterable

import ml_collections

from nsl.errors import ConfigError

# REFERENCES §1: the SPS size ladder (vocab 50304, tied embeddings, SwiGLU hidden 3d).
SIZES: dict[str, dict[str, int]] = {
    "xs": dict(n_layers=8, d_model=512, n_heads=8, d_ff=1536),
    "s": dict(n_layers=12, d_model=768, n_heads=12, d_ff=2304),
    "m": dict(n_layers=24, d_model=1024, n_heads=16, d_ff=3072),
    "l": dict(n_layers=36, d_model=1280, n_heads=20, d_ff=3840),
    "xl": dict(n_layers=48, d_model=1600, n_heads=25, d_ff=4800),
}
# The published parameter counts of the ladder, for tests and docs.
LADDER_PARAMS = {"xs": 53e6, "s": 131e6, "m": 379e6, "l": 831e6, "xl": 1.678e9}

DTYPES = ("auto", "float32", "bfloat16", "float16")
SCHEDULES = ("wsd", "cosine")
REMAT = ("none", "full", "dots")


def apply_size(config: ml_collections.ConfigDict, size: str) -> ml_collections.ConfigDict:
  """Sets the model dimensions of a ladder size on `config.model`."""
  if size not in SIZES:
    raise ConfigError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
  config.model.update(SIZES[size])
  return config


def load_config(path: str, overrides: Iterable[tuple[str, str]] = ()) -> ml_collections.ConfigDict:
  """Loads `get_config()` from a Python file and applies `field=value` overrides."""
  if not os.path.isfile(path):
    raise ConfigError(f"config file {path!r} does not exist")
  # Config files import shared pieces (`from configs import base`): make the directory that
  # holds `configs/` importable wherever the command runs from.
  root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
  if os.path.basename(os.path.dirname(os.path.abspath(path))) == "configs" and root not in sys.path:
    sys.path.insert(0, root)
  spec = importlib.util.spec_from_file_location(f"nsl_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # a config file is user code: report where it broke
    raise ConfigError(f"config file {path!r} failed to load: {type(e).__name__}: {e}") from e
  if not hasattr(module, "get_config"):
    raise ConfigError(f"config file {path!r} defines no get_config()")
  config = module.get_config()
  for key, value in overrides:
    set_field(config, key, value)
  return config


def split_overrides(argv: Iterable[str]) -> tuple[list[tuple[str, str]], list[str]]:
  """Separates `--config.a.b=VALUE` overrides from the other command-line arguments."""
  overrides, rest = [], []
  for arg in argv:
    if arg.startswith("--config."):
      key, sep, value = arg[len("--config."):].partition("=")
      if not sep:
        raise ConfigError(f"override {arg!r} needs a value: --config.{key}=VALUE")
      overrides.append((key, value))
    else:
      rest.append(arg)
  return overrides, rest


def _all_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  keys = []
  for k, v in config.items():
    keys.append(prefix + k)
    if isinstance(v, ml_collections.ConfigDict):
      keys.extend(_all_keys(v, prefix + k + "."))
  return keys


def set_field(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
  """Sets `config.<key>` from a command-line string, typed like the existing field."""
  parts = key.split(".")
  node = config
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      close = difflib.get_close_matches(key, _all_keys(config), n=1)
      hint = f" (did you mean {close[0]!r}?)" if close else ""
      raise ConfigError(f"unknown config key {key!r}{hint}")
    if i < len(parts) - 1:
      node = node[part]
  current = node[parts[-1]]
  if isinstance(current, ml_collections.ConfigDict):
    raise ConfigError(f"config key {key!r} is a section; set one of its fields")
  value = parse_value(raw, current, key)
  try:
    node[parts[-1]] = value
  except (TypeError, ValueError) as e:
    raise ConfigError(f"config.{key}: cannot set {raw!r}: {e}") from e


def parse_value(raw: str, current: Any, key: str) -> Any:
  """Parses a CLI string into the type of `current` (bool, int, float, str, tuple, None)."""
  if isinstance(raw, str) and raw.strip().lower() in ("none", "null") and not isinstance(current, str):
    return None
  try:
    if isinstance(current, bool):
      low = raw.strip().lower()
      if low in ("true", "1", "yes"):
        return True
      if low in ("false", "0", "no"):
        return False
      raise ValueError("expected true or false")
    if isinstance(current, int):
      return int(raw)
    if isinstance(current, float):
      return float(raw)
    if isinstance(current, str):
      return raw
    value = ast.literal_eval(raw)
    if isinstance(current, (tuple, list)) and isinstance(value, (tuple, list)):
      return type(current)(value)
    return value
  except (ValueError, SyntaxError) as e:
    kind = type(current).__name__ if current is not None else "a Python literal"
    raise ConfigError(f"config.{key}: {raw!r} is not a valid {kind}") from e


def to_dict(config: ml_collections.ConfigDict) -> dict:
  return json.loads(config.to_json_best_effort())


def _positive(config, field: str) -> None:
  node, *rest = field.split(".")
  value = config[node]
  for part in rest:
    value = value[part]
  if value is None or value <= 0:
    raise ConfigError(f"config.{field} must be positive, got {value}")


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None, num_processes: int = 1) -> None:
  """Checks the trunk-level consistency of a config; the family checks its own section."""
  from nsl.models import registry  # late: registry imports the families

  if config.family not in registry.FAMILIES:
    raise ConfigError(f"config.family={config.family!r} is unknown; choose one of {sorted(registry.FAMILIES)}")
  m, d, t = config.model, config.data, config.train
  for field in ("model.d_model", "model.n_layers", "model.n_heads", "model.d_ff", "model.vocab_size",
                "data.seq_len", "train.batch_size", "train.steps", "train.lr", "train.grad_accum",
                "train.log_every", "train.eval_every", "train.eval_batches"):
    _positive(config, field)
  if m.d_model % m.n_heads:
    raise ConfigError(f"config.model.n_heads={m.n_heads} does not divide config.model.d_model={m.d_model}")
  if (m.d_model // m.n_heads) % 2:
    raise ConfigError(f"head dim d_model/n_heads={m.d_model // m.n_heads} must be even for RoPE; "
                      "change config.model.n_heads")
  if m.window is not None and not 0 <= m.window <= d.seq_len:
    raise ConfigError(f"config.model.window={m.window} must be in [0, data.seq_len={d.seq_len}] "
                      "(use None for an unbounded window)")
  if m.dtype not in DTYPES:
    raise ConfigError(f"config.model.dtype={m.dtype!r} must be one of {DTYPES}")
  if m.remat not in REMAT:
    raise ConfigError(f"config.model.remat={m.remat!r} must be one of {REMAT}")
  from nsl import attention
  if m.attention_impl not in attention.IMPLS:
    raise ConfigError(f"config.model.attention_impl={m.attention_impl!r} must be one of {attention.IMPLS}")
  if t.schedule not in SCHEDULES:
    raise ConfigError(f"config.train.schedule={t.schedule!r} must be one of {SCHEDULES}")
  if t.warmup_steps < 0 or t.decay_steps < 0 or t.warmup_steps + t.decay_steps > t.steps:
    raise ConfigError(f"config.train.warmup_steps={t.warmup_steps} + decay_steps={t.decay_steps} "
                      f"must be non-negative and at most train.steps={t.steps}")
  if not 0.0 <= t.min_lr_ratio <= 1.0:
    raise ConfigError(f"config.train.min_lr_ratio={t.min_lr_ratio} must be in [0, 1]")
  if t.batch_size % t.grad_accum:
    raise ConfigError(f"config.train.batch_size={t.batch_size} is not divisible by "
                      f"config.train.grad_accum={t.grad_accum}")
  if t.batch_size % num_processes:
    raise ConfigError(f"config.train.batch_size={t.batch_size} is not divisible by the "
                      f"{num_processes} processes")
  if num_devices is not None:
    from nsl import sharding
    data_parallel = sharding.data_parallel_size(config, num_devices)
    micro = t.batch_size // t.grad_accum
    if micro % data_parallel:
      raise ConfigError(f"the micro-batch train.batch_size/train.grad_accum={micro} is not divisible by "
                        f"the {data_parallel} data-parallel devices (mesh data x fsdp)")
  registry.get_family_class(config.family).validate(config)
