"""Config loading, CLI overrides, size ladders and validation.

Configs are Python files with `get_config() -> ml_collections.ConfigDict` (configs-as-code), or
`get_config(arg)` for one file per family (`configs/sps.py:xl`). `load_config("FILE.py[:ARG]",
overrides)` applies `--config.a.b=value` overrides with the type of the existing field, and
`validate` turns every inconsistent value into a `ConfigError` naming the field.
Family-specific checks live in each family's `validate`.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.machinery
import importlib.util
import inspect
import json
import math
import os
import sys
from typing import Any, Iterable

import ml_collections

from nsl.errors import ConfigError

# The SPS size ladder (docs/papers/sps.md#ladder): vocab 50304, tied embeddings, SwiGLU hidden 3d.
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


# Renamed experiments resolve through the aliases that live beside the configs: a config
# directory's `aliases.py` maps each family file to the removed names it took over (`FOLDED`;
# configs/aliases.py, issue #18), read by `folded` when a removed path is asked for.
ALIASES_FILE = "aliases.py"
# nsl's own configs/ (an editable checkout): what `from configs import base` finds in a config file
# that lives outside a `configs` directory.
CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def split_config_arg(spec: str) -> tuple[str, str | None]:
  """`FILE.py:ARG` -> (FILE.py, ARG) (big_vision's `--config=file.py:arg`); a plain path -> (path, None)."""
  if os.path.isfile(spec):
    return spec, None
  file, sep, arg = spec.partition(".py:")
  return (file + ".py", arg) if sep else (spec, None)


def folded(directory: str = CONFIGS_DIR) -> dict[str, tuple[str, ...]]:
  """The `FOLDED` table of a config directory's `aliases.py` (family file stem -> the removed
  names it took over); {} where there is none."""
  path = os.path.join(directory or ".", ALIASES_FILE)
  if not os.path.isfile(path):
    return {}
  module_spec = importlib.util.spec_from_file_location(f"nsl_aliases_{abs(hash(os.path.abspath(path)))}", path)
  module = importlib.util.module_from_spec(module_spec)
  with configs_package(path):  # `from configs import sps`
    try:
      module_spec.loader.exec_module(module)
    except Exception as e:  # user code: report where it broke
      raise ConfigError(f"config aliases {path!r} failed to load: {type(e).__name__}: {e}") from e
  return {family: tuple(names) for family, names in getattr(module, "FOLDED", {}).items()}


def resolve_config(spec: str) -> tuple[str, str | None]:
  """(file, argument) of a `--config` value: FILE:ARG split, a removed path mapped through the
  aliases beside it (`folded`) to its family file in the same directory (`configs/sps_xl.py` ->
  `configs/sps.py`, `sps_xl`)."""
  path, arg = split_config_arg(spec)
  if arg is None and not os.path.isfile(path) and path.endswith(".py"):
    name, directory = os.path.basename(path)[:-len(".py")], os.path.dirname(path)
    for family, names in folded(directory).items():
      target = os.path.join(directory, f"{family}.py")
      if name in names and os.path.isfile(target):
        return target, name
  return path, arg


def _canonical_arg(path: str, arg: str, choices: tuple[str, ...]) -> str:
  """`arg` as one of the file's ARGS; the file's own name may be left off (`sps.py:xl` = `sps_xl`)."""
  stem = os.path.basename(path)[:-len(".py")]
  for candidate in (arg, f"{stem}_{arg}"):
    if candidate in choices:
      return candidate
  raise ConfigError(f"config file {path!r} has no argument {arg!r}; choose one of {', '.join(choices)} "
                    f"(the leading '{stem}_' may be left off)")


@contextlib.contextmanager
def configs_package(path: str):
  """`configs` importable while the config (or grid) file `path` loads, without a sys.path entry:
  the `configs` directory holding it (its own or its parent: configs/grids/), a user's copy
  shadowing nsl's, then nsl's own configs/. The caller's `configs` modules are put back after."""
  mine = lambda name: name == "configs" or name.startswith("configs.")
  here = os.path.dirname(os.path.abspath(path))
  locations = [d for d in (here, os.path.dirname(here)) if os.path.basename(d) == "configs"][:1]
  if os.path.isdir(CONFIGS_DIR) and not any(os.path.samefile(CONFIGS_DIR, d) for d in locations):
    locations.append(CONFIGS_DIR)
  saved = {name: sys.modules.pop(name) for name in list(sys.modules) if mine(name)}
  spec = importlib.machinery.ModuleSpec("configs", None, is_package=True)
  spec.submodule_search_locations = locations
  sys.modules["configs"] = importlib.util.module_from_spec(spec)
  try:
    yield
  finally:
    for name in [name for name in sys.modules if mine(name)]:
      del sys.modules[name]
    sys.modules.update(saved)


def _takes_argument(fn) -> bool:
  try:
    return bool(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    return False


def load_config(spec: str, overrides: Iterable[tuple[str, str]] = ()) -> ml_collections.ConfigDict:
  """Loads a config file's `get_config()`, or `get_config(ARG)` for `FILE.py:ARG`, and applies
  `field=value` overrides. A file that takes an argument lists the valid ones in `ARGS`."""
  path, arg = resolve_config(spec)
  if not os.path.isfile(path):
    raise ConfigError(f"config file {path!r} does not exist")
  module_spec = importlib.util.spec_from_file_location(f"nsl_config_{abs(hash(os.path.abspath(path)))}", path)
  module = importlib.util.module_from_spec(module_spec)
  with configs_package(path):  # `from configs import base`
    try:
      module_spec.loader.exec_module(module)
    except Exception as e:  # a config file is user code: report where it broke
      raise ConfigError(f"config file {path!r} failed to load: {type(e).__name__}: {e}") from e
    if not hasattr(module, "get_config"):
      raise ConfigError(f"config file {path!r} defines no get_config()")
    choices = tuple(getattr(module, "ARGS", ()))
    if arg is None and choices:
      raise ConfigError(f"config file {path!r} takes an argument: --config={path}:ARG with ARG one of "
                        f"{', '.join(choices)}")
    if arg is not None and not _takes_argument(module.get_config):
      raise ConfigError(f"config file {path!r} takes no argument; drop ':{arg}'")
    if arg is not None and choices:
      arg = _canonical_arg(path, arg, choices)
    try:
      config = module.get_config() if arg is None else module.get_config(arg)
    except ConfigError as e:  # already one line saying what is wrong
      raise ConfigError(f"config file {path!r}: {e}") from e
    except Exception as e:  # user code again
      raise ConfigError(f"config file {path!r}: get_config() raised {type(e).__name__}: {e}") from e
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"config file {path!r}: get_config() returned {type(config).__name__}, not an "
                      "ml_collections.ConfigDict; return the config (e.g. start from configs/base.py)")
  from nsl import options

  options.upgrade(config)  # a config file written for an older layout reads as today's
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


def set_field(config: ml_collections.ConfigDict, key: str, raw: str) -> None:
  """Sets `config.<key>` from a command-line string, typed like the existing field."""
  parts = key.split(".")
  node = config
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      from nsl import options, schema

      hint = options.moved_hint(key, config.family) or schema.did_you_mean(key, schema.keys(config))
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


def init_seed(config) -> int:
  """The seed of the parameters' initialisation: `config.init_seed`, or `config.seed` when it is None
  or absent (configs and checkpoints from before the field), so such runs keep their bits."""
  init = config.init_seed
  return config.seed if init is None else init


def to_dict(config: ml_collections.ConfigDict) -> dict:
  return json.loads(config.to_json_best_effort())


# Fields a resume may change (docs/guide/training.md#checkpoints): how long to train,
# how a batch is split into micro-batches (the same update), what to log and evaluate, how to
# checkpoint, how attention is computed (the same function), the mesh (the state is resharded),
# how shards are verified or found, where the prepared data dir lies (data.path: a grid moves it
# into its root, nsl.scaling.griddata; what it holds is fixed by data.sources, the tokenizer and
# val_fraction, which are compared). Every other field fixes the parameters' shapes, the data
# stream or the model's function, and must match the checkpoint's.
RESUME_MAY_CHANGE = (
    "train.steps", "train.grad_accum", "train.log_every", "train.eval_every", "train.eval_batches",
    "train.max_nonfinite", "checkpoint", "mesh", "data.verify", "data.gpt2_bpe", "data.path",
    "model.attention_impl",
    "model.attention_chunk", "model.remat", "model.cpu_kernels", "evals", "log", "train.profile_steps",
)


def _check_kernels(m) -> None:
  """`model.attention_impl` names an attention entry of the kernel registry (or auto), and a C++
  CPU kernel is not named while `model.cpu_kernels` switches them off."""
  from nsl.kernels import registry
  impls = ("auto",) + registry.names("attention")
  if m.attention_impl not in impls:
    raise ConfigError(f"config.model.attention_impl={m.attention_impl!r} must be one of {impls}")
  cpu_kernels = m.cpu_kernels
  if not isinstance(cpu_kernels, bool):
    raise ConfigError(f"config.model.cpu_kernels={cpu_kernels!r} must be True or False")
  if not cpu_kernels and m.attention_impl != "auto" and registry.get("attention", m.attention_impl).cpu_kernel:
    raise ConfigError(f"config.model.attention_impl={m.attention_impl!r} is a C++ CPU kernel, which "
                      "config.model.cpu_kernels=False switches off; use auto or chunked, or turn them on")


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
  """A nested config dict as {"a.b.c": leaf}."""
  if not isinstance(d, dict):
    return {prefix[:-1]: d}
  out = {}
  for k, v in d.items():
    out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def resume_differences(saved: dict, now: dict) -> list[tuple[str, Any, Any]]:
  """(field, saved value, new value) for every field outside RESUME_MAY_CHANGE that differs, the
  family and variant first (a change of family is named as that, not as one of the sizes it
  brings). A checkpoint from an older nsl is read in today's layout (`nsl.options.upgraded`); the
  options of families other than the run's are not compared, nor fields only one side has."""
  from nsl import options

  a, b = (flatten(options.own_sections(options.upgraded(d))) if d else {} for d in (saved, now))
  may = lambda f: any(f == p or f.startswith(p + ".") for p in RESUME_MAY_CHANGE)
  order = lambda f: (f not in ("family", "model.variant"), f)
  return [(f, a[f], b[f]) for f in sorted(set(a) & set(b), key=order) if not may(f) and a[f] != b[f]]


def _get(config, field: str):
  value = config
  for part in field.split("."):
    try:
      value = value[part]
    except (KeyError, AttributeError, TypeError):
      raise ConfigError(f"config.{field} is missing; start the config from configs/base.py") from None
  return value


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(config, field: str) -> None:
  value = _get(config, field)
  if not _is_number(value) or not math.isfinite(value) or value <= 0:
    raise ConfigError(f"config.{field} must be positive, got {value}")


def _integer(config, field: str, minimum: int) -> None:
  value = _get(config, field)
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    what = {0: "a non-negative integer", 1: "positive (an integer >= 1)"}.get(minimum, f"an integer >= {minimum}")
    raise ConfigError(f"config.{field} must be {what}, got {value!r}")


def _in_range(config, field: str, lo: float, hi: float, hi_open: bool = True, why: str = "") -> None:
  value = _get(config, field)
  ok = _is_number(value) and math.isfinite(value) and lo <= value and (value < hi if hi_open else value <= hi)
  if not ok:
    interval = f"[{lo}, {hi})" if hi_open else f"[{lo}, {hi}]"
    raise ConfigError(f"config.{field}={value!r} must be a finite number in {interval}{why}")


# Token ids are int32 in every batch; past this a vocabulary cannot be indexed.
MAX_VOCAB_SIZE = (1 << 31) - 1
# The longest row nsl supports: per-slot metadata, segment ids and the host-side tile plans are
# O(seq_len), but one row's activations at 2**22 tokens already exceed any single device's memory
# for the smallest useful width, so longer rows are refused up front rather than half-built.
MAX_SEQ_LEN = 1 << 22


def _check_mesh_shape(config) -> None:
  shape = _get(config, "mesh.shape")
  ok = (isinstance(shape, (tuple, list)) and len(shape) == 3
        and all(isinstance(n, int) and not isinstance(n, bool) and (n >= 1 or n == -1) for n in shape)
        and sum(n == -1 for n in shape) <= 1)
  if not ok:
    raise ConfigError(f"config.mesh.shape={shape!r} must be three integers (data, fsdp, tensor), each >= 1 "
                      "or one of them -1 (fill the remaining devices), e.g. --config.mesh.shape=\"(-1,1,1)\"")


def _check_numeric_ranges(config) -> None:
  """Every trunk field with a meaningful range, named when out of it."""
  m = config.model
  for field in ("train.lr", "train.eps", "model.rope_theta", "model.norm_eps", "model.init_std"):
    _positive(config, field)
  _in_range(config, "train.b1", 0.0, 1.0, why=" (Adam's first-moment decay)")
  _in_range(config, "train.b2", 0.0, 1.0, why=" (Adam's second-moment decay)")
  _in_range(config, "train.weight_decay", 0.0, math.inf)
  _in_range(config, "data.val_fraction", 0.0, 1.0)
  clip = _get(config, "train.clip_norm")
  if clip is not None and (not _is_number(clip) or not math.isfinite(clip) or clip <= 0):
    raise ConfigError(f"config.train.clip_norm={clip!r} must be a positive number, or None for no clipping "
                      "(0 would zero every update)")
  _integer(config, "seed", 0)
  init = config.init_seed
  if init is not None and (not isinstance(init, int) or isinstance(init, bool) or init < 0):
    raise ConfigError(f"config.init_seed={init!r} must be a non-negative integer, or None for the same as "
                      "config.seed, e.g. --config.init_seed=3")
  _integer(config, "train.max_nonfinite", 1)
  _integer(config, "model.attention_chunk", 0)
  _integer(config, "checkpoint.every", 1)
  _integer(config, "checkpoint.keep", 1)
  minutes = config.checkpoint.every_minutes
  if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or minutes < 0:
    raise ConfigError(f"config.checkpoint.every_minutes={minutes!r} must be a number of minutes >= 0 (0 = off), "
                      "e.g. --config.checkpoint.every_minutes=10")
  for field in ("model.d_model", "model.n_layers", "model.n_heads", "model.d_ff", "model.vocab_size",
                "data.seq_len", "train.batch_size", "train.steps", "train.grad_accum", "train.log_every",
                "train.eval_every", "train.eval_batches"):
    _integer(config, field, 1)
  if m.vocab_size > MAX_VOCAB_SIZE:
    raise ConfigError(f"config.model.vocab_size={m.vocab_size} exceeds {MAX_VOCAB_SIZE} (token ids are int32); "
                      "use a smaller vocabulary")
  if config.data.seq_len > MAX_SEQ_LEN:
    raise ConfigError(f"config.data.seq_len={config.data.seq_len} exceeds the {MAX_SEQ_LEN} tokens nsl supports "
                      "per row (one row's activations alone would not fit a device); use a shorter seq_len")
  path = _get(config, "data.path")
  if not isinstance(path, str) or not path.strip():
    raise ConfigError(f"config.data.path={path!r} must name the prepared data directory, e.g. "
                      "--config.data.path=data/sotu-bpe4k")
  if config.data.verify not in ("size", "sha256"):
    raise ConfigError(f"config.data.verify={config.data.verify!r} must be 'size' or 'sha256'")
  _check_mesh_shape(config)


def estimate_memory(config, num_devices: int) -> dict[str, float]:
  """Bytes per device a training run needs, from shapes only (before anything is allocated).

  A deliberate lower bound, used to refuse what cannot fit: fp32 parameters, gradients and two
  Adam moments (16 bytes per parameter) spread over the fsdp x tensor axes, plus the activations
  one micro-batch keeps for the backward pass (per layer 4·d_model values per slot; with remat
  one layer's) and the fp32 logits and their gradient.
  """
  from nsl.models import registry

  counts = registry.get_family(config).param_counts()
  m, t = config.model, config.train
  shape = list(config.mesh.shape)
  if -1 in shape:
    known = math.prod(n for n in shape if n != -1)
    shape[shape.index(-1)] = max(1, num_devices // max(known, 1))
  data, fsdp, tensor = shape
  state = 16.0 * counts["params_total"] / max(1, fsdp * tensor)
  rows = max(1, t.batch_size // t.grad_accum // max(1, data * fsdp))
  tokens = rows * config.data.seq_len
  act_bytes = 4 if m.dtype in ("float32", "auto") else 2
  layers_kept = 1 if m.remat == "full" else m.n_layers
  activations = tokens * (layers_kept * 4 * m.d_model * act_bytes + 2 * 4 * m.vocab_size / max(1, tensor))
  return {"state": state, "activations": activations, "total": state + activations}


def device_memory_bytes(device) -> tuple[float | None, str]:
  """(bytes a device can hold, a description): the accelerator's limit, or host RAM for CPU."""
  try:
    stats = device.memory_stats() or {}
  except Exception:  # not every backend reports memory
    stats = {}
  if stats.get("bytes_limit"):
    return float(stats["bytes_limit"]), f"{device.device_kind} memory"
  if device.platform == "cpu":
    try:
      return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "host RAM"
    except (ValueError, OSError, AttributeError):
      return None, ""
  return None, ""


def check_fits_memory(config, devices) -> None:
  """ConfigError with the figures when the run cannot fit its devices' memory."""
  devices = list(devices)
  if not devices:
    return
  need = estimate_memory(config, len(devices))
  limit, what = device_memory_bytes(devices[0])
  if limit is None:
    return
  per_host = devices[0].platform == "cpu"
  total = need["total"] * (sum(d.process_index == devices[0].process_index for d in devices) if per_host else 1)
  if total > limit:
    gib = lambda b: f"{b / 2**30:,.1f} GiB"
    scope = "for this host's devices" if per_host else "per device"
    raise ConfigError(f"this config needs at least {gib(total)} {scope} (parameters + optimizer "
                      f"{gib(need['state'])}, activations {gib(need['activations'])} per device) but the "
                      f"{what} is {gib(limit)}; reduce model.d_model / n_layers / vocab_size, data.seq_len or "
                      "train.batch_size, raise train.grad_accum, or shard over more devices (mesh.shape)")


def _short_run_hint(t) -> str:
  """The overrides that make a shortened recipe valid (docs/guide/paper_size.md#shorten): warmup at
  most 10% and decay at most the last 20% of train.steps, each kept where it already fits."""
  if t.warmup_steps < 0 or t.decay_steps < 0:
    return ""
  fix = {"warmup_steps": min(t.warmup_steps, t.steps // 10), "decay_steps": min(t.decay_steps, t.steps // 5)}
  flags = " ".join(f"--config.train.{k}={v}" for k, v in fix.items() if v != t[k])
  return f"; for a run of {t.steps} steps add {flags} (warmup <= 10%, the last <= 20% decayed)"


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None, num_processes: int = 1) -> None:
  """Checks the trunk-level consistency of a config; the family checks its own section."""
  from nsl import options
  from nsl.models import registry  # late: registry imports the families

  if config.family not in registry.FAMILIES:
    raise ConfigError(f"config.family={config.family!r} is unknown; choose one of {sorted(registry.FAMILIES)}")
  options.check_known(config)  # every field is a schema's (nsl.schema), a stray named with "did you mean"
  m, d, t = config.model, config.data, config.train
  _check_numeric_ranges(config)
  if d.mixture:  # a negative weight or a zero sum stops here, before anything is written
    from nsl.data import mixture
    mixture.parse(d.mixture)
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
  _check_kernels(m)
  if t.schedule not in SCHEDULES:
    raise ConfigError(f"config.train.schedule={t.schedule!r} must be one of {SCHEDULES}")
  if t.warmup_steps < 0 or t.decay_steps < 0 or t.warmup_steps + t.decay_steps > t.steps:
    raise ConfigError(f"config.train.warmup_steps={t.warmup_steps} + decay_steps={t.decay_steps} "
                      f"must be non-negative and at most train.steps={t.steps}{_short_run_hint(t)}")
  if not 0.0 <= t.min_lr_ratio <= 1.0:
    raise ConfigError(f"config.train.min_lr_ratio={t.min_lr_ratio} must be in [0, 1]")
  if t.batch_size % t.grad_accum:
    raise ConfigError(f"config.train.batch_size={t.batch_size} is not divisible by "
                      f"config.train.grad_accum={t.grad_accum}")
  if t.batch_size % num_processes:
    raise ConfigError(f"config.train.batch_size={t.batch_size} is not divisible by the "
                      f"{num_processes} processes; use a process count that divides it (a resumed run "
                      "keeps its global batch)")
  if num_devices is not None:
    from nsl import sharding
    data_parallel = sharding.data_parallel_size(config, num_devices)
    micro = t.batch_size // t.grad_accum
    if micro % data_parallel:
      raise ConfigError(f"the micro-batch train.batch_size/train.grad_accum={micro} is not divisible by "
                        f"the {data_parallel} data-parallel devices (mesh data x fsdp); use a device count "
                        "or config.mesh.shape whose data x fsdp divides it (a resumed run keeps its global batch)")
  from nsl.nn import mup
  mup.validate(config)  # model.mup_base_width (μP), checked here and only here
  from nsl.evals import specs
  from nsl.train import observe
  specs.validate(config)  # config.evals' shape; its files are checked when the trainer builds them
  observe.validate(config)  # train.profile_steps, config.log
  registry.get_family_class(config.family).validate(config)
