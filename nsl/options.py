"""The run's option schemas and the base config built from them (docs/reference/config.md).

`base_config()` is a complete, valid config: a small standard transformer on the embedded
default corpus (State of the Union speeches, BPE 4096), every field of every schema at its
default: the run's sections below, the trunk's `nsl.nn.layers.Dims` with `Model` at `config.model`,
and each registered family's own options at `config.<family>` (`Family.options`). configs/base.py
returns it; experiment files start from it and change only what differs (configs-as-code).

Over the whole layout (`mounts`): `check_known` refuses a field no schema declares, with "did you
mean" or where it moved; `upgrade` reads a config written by an older nsl (a checkpoint's
config.json, a config file) in today's layout, its family's options moved from where
`Family.legacy` says they lived and every missing field at its default; `legacy_layout` is the
inverse a grid's run ids are computed in, so grids run before keep their ids.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from nsl import schema
from nsl.errors import ConfigError
from nsl.nn.layers import Dims

# Logical axis -> mesh axes ('data', 'fsdp', 'tensor'): the one sharding table
# (docs/design.md#sharding). Batch over data x fsdp; FSDP shards the embed dimension of every
# weight; tensor parallelism splits heads, the MLP hidden and the vocabulary.
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("act_embed", None),
    ("heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("layers", None),  # the stacked axis of model.scan_layers: every device holds all layers
)
# The base trunk's sizes (Dims declares no default for them): 4 layers of width 256, SwiGLU 3d.
TRUNK = dict(vocab_size=4096, d_model=256, n_layers=4, n_heads=4, d_ff=768)


@dataclasses.dataclass(frozen=True)
class Run:
  """The config's top level."""

  family: str = "standard"  # nsl.models.registry.FAMILIES
  seed: int = 0  # data order, per-step randomness, and the parameters unless init_seed is set
  # The parameters' initialisation only (PRNGKey(init_seed)); None = the same as `seed`, so runs
  # that never set it keep their bits. Vary it with the data order held fixed to see the spread
  # that initialisation alone causes (docs/xcheck/sps.md).
  init_seed: int | None = None
  # Evaluators run every train.eval_every beside the validation NLL, logged as "<name>/<metric>"
  # (docs/guide/evaluation.md#evaluators-during-training; their kinds: docs/reference/evaluators.md), e.g.
  #   c.evals = {"wiki": {"kind": "nll", "data": "data/wiki-bpe4k", "batches": 4}}
  # Empty by default, and an empty one is left out of grid cell ids (nsl.scaling.cells.config_hash).
  evals: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Model:
  """`config.model`'s fields beside the trunk's `Dims`."""

  variant: str = "standard"  # the family's variant (Family.variants)
  # Standard: optional sliding window over keys. SPS: the temporary-key window w. None = unbounded.
  window: int | None = None
  # The C++ CPU kernels (attention, the head + loss, a decode step's attention and products) where
  # the registry picks them; False runs the XLA paths everywhere (same math, other bits).
  cpu_kernels: bool = True


@dataclasses.dataclass(frozen=True)
class Data:
  path: str = "data/sotu-bpe4k"  # prepared shards (python -m nsl.data.prepare)
  sources: tuple[str, ...] = ("sotu",)  # used to prepare `path` when it does not exist yet
  tokenizer: str = "bpe"  # byte | bpe | gpt2
  tokenizer_vocab: int = 4096  # bpe only
  gpt2_bpe: str = ""  # gpt2 ranks file; empty = $NSL_GPT2_BPE, then tiktoken's download
  val_fraction: float = 0.05
  seq_len: int = 256
  verify: str = "size"  # size | sha256: how shards are checked when opened
  # "DIR=WEIGHT,DIR=WEIGHT": train on a weighted mixture of prepared data dirs (one tokenizer)
  # instead of `path`, validating on each (docs/guide/data.md#mixtures); "" = `path` alone
  mixture: str = ""
  # Prompt masking: next-token targets count only from this token on within a document (the
  # answer of a planning task, docs/papers/nextlat.md); -1 = every target counts (plain text).
  answer_token: int = -1


@dataclasses.dataclass(frozen=True)
class Train:
  steps: int = 1000
  batch_size: int = 16  # global, in sequences
  grad_accum: int = 1
  lr: float = 3e-3
  schedule: str = "wsd"  # wsd: warmup, constant, linear decay | cosine
  warmup_steps: int = 50
  decay_steps: int = 200  # length of the final linear decay (wsd)
  min_lr_ratio: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  weight_decay: float = 0.1
  clip_norm: float | None = 1.0  # None: no clipping
  log_every: int = 10
  eval_every: int = 250
  eval_batches: int = 16
  max_nonfinite: int = 20  # consecutive non-finite steps before the run stops
  # (a, b): a jax.profiler trace of steps a..b (1-based, inclusive) to <workdir>/profile, for
  # TensorBoard's profile plugin (docs/guide/training.md#profiling). None = no trace.
  profile_steps: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Log:
  """Where the scalars of metrics.jsonl are mirrored besides TensorBoard
  (docs/guide/training.md#weights-biases). Never part of a grid cell's id."""

  wandb: bool = False  # Weights & Biases (pip install 'nsl[wandb]'); only process 0 logs
  wandb_project: str = "nsl"
  wandb_name: str = ""  # the run's name there; "" = the workdir's basename
  wandb_entity: str = ""  # team or user; "" = wandb's default
  wandb_mode: str = ""  # online | offline | disabled; "" = wandb's default ($WANDB_MODE, else online)
  # Each process appends a hash of every training row it reads, per step, to
  # <workdir>/data_trace/process_P-of-N.jsonl: which examples each step saw, checkable across
  # resumes onto other process counts (docs/guide/training.md#elastic-resume).
  data_trace: bool = False


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  every: int = 250
  # Also save when this many minutes passed since the last save (0 = off): bounds what a preemption
  # loses in time whatever a step costs (docs/guide/pods.md#preemption). Not part of a grid cell's id.
  every_minutes: float = 0.0
  keep: int = 3
  async_save: bool = True


@dataclasses.dataclass(frozen=True)
class Mesh:
  shape: tuple[int, ...] = (-1, 1, 1)  # ('data', 'fsdp', 'tensor'); -1 fills the remaining devices
  rules: tuple = DEFAULT_RULES


# Section path -> its schemas ("" the top level); the families' are added by `mounts`.
SECTIONS: dict[str, tuple[type, ...]] = {
    "": (Run,), "model": (Dims, Model), "data": (Data,), "train": (Train,), "log": (Log,),
    "checkpoint": (Checkpoint,), "mesh": (Mesh,)}


def moved_hint(path: str, family: str | None = None) -> str:
  """' (moved: config.NEW ...)' when `path` is where a family's option lived before its mount
  (`Family.legacy`; `family`'s own first, model.gen_layers being two families'); '' otherwise."""
  for cls in sorted(_family_classes(), key=lambda c: c.name != family):
    for old, new in cls.legacy.items():
      if path == old or path.startswith(old + "."):
        where = f"{cls.name}{path[len(old):]}" if new == "*" else f"{cls.name}.{new}"
        return f" (moved: config.{where}; each family's options have their own section)"
  return ""


def _family_classes():
  from nsl.models import registry

  return [registry.get_family_class(name) for name in registry.FAMILIES]


def mounts() -> dict[str, tuple[type, ...]]:
  """Section path -> the schemas mounted there ("" is the config's top level)."""
  out = dict(SECTIONS)
  for cls in _family_classes():
    if cls.options is not None:
      out[cls.name] = (cls.options,)
  return out


def check_known(config) -> None:
  """ConfigError naming the first field no schema declares, with "did you mean" or where it moved."""
  sections = mounts()
  allowed = {"": set(sections) - {""}}
  for path, schemas in sections.items():
    allowed.setdefault(path, set()).update(n for s in schemas for n in schema.field_names(s))
  known = [f"{p}.{n}".lstrip(".") for p, names in allowed.items() for n in names]
  for path, names in allowed.items():
    node = config if not path else config.get(path)
    if node is None:
      raise ConfigError(f"config.{path} is missing; {schema.MISSING_HINT}")
    for key in node.keys():
      if key not in names:
        full = f"{path}.{key}".lstrip(".")
        hint = moved_hint(full, config.get("family")) or schema.did_you_mean(full, known)
        raise ConfigError(f"config.{full} is not an option{hint}")


def _move_legacy(config, cls) -> None:
  """`cls.legacy`'s fields of a config written before `config.<family>` held them, moved there."""
  for old, new in cls.legacy.items():
    *parents, leaf = old.split(".")
    node = config
    for p in parents:
      node = node.get(p) if node is not None else None
    if node is None or leaf not in node:
      continue
    value = node[leaf]
    del node[leaf]
    target = config[cls.name]
    if new == "*":  # a whole section moved (config.model.nextlat -> config.nextlat)
      for k, v in (value.items() if value is not None else ()):
        target[k] = v
    elif value is not None or schema.optional(cls.options, new):
      target[new] = value  # None meant "the default" where the option takes no None


def upgrade(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """In place: the options of a config written by an older nsl (a checkpoint's config.json, a
  config file) moved to their mounts and every missing field filled with its default (a field
  with no default, such as model.d_model, must be there). Returns `config`."""
  from nsl.models import registry

  for path, schemas in mounts().items():
    node = config if not path else config.get(path)
    if node is None:
      config[path] = node = ml_collections.ConfigDict()
    for s in schemas:
      for name in schema.field_names(s):
        value = schema.default(s, name)
        if name not in node and value is not dataclasses.MISSING:
          node[name] = schema.entry(s, name, value)
  if config.get("family") in registry.FAMILIES:
    cls = registry.get_family_class(config.family)
    if cls.options is not None and cls.legacy:
      _move_legacy(config, cls)
  return config


def upgraded(config_dict: dict) -> dict:
  """`upgrade` of a plain dict (a saved config.json), as a plain dict."""
  import json

  return json.loads(upgrade(ml_collections.ConfigDict(config_dict)).to_json_best_effort())


def own_sections(config_dict: dict) -> dict:
  """A config dict without the option sections of families other than its own (they change
  nothing the run computes)."""
  own = config_dict.get("family")
  others = {cls.name for cls in _family_classes() if cls.options is not None and cls.name != own}
  return {k: v for k, v in config_dict.items() if k not in others}


def _put(d: dict, path: str, value) -> None:
  *parents, leaf = path.split(".")
  for p in parents:
    d[p] = d = dict(d.get(p) or {})
  d[leaf] = value


def legacy_kept(config_dict: dict) -> tuple[str, ...]:
  """The run's family's `Family.legacy_kept` (() for an unknown family)."""
  from nsl.models import registry

  own = config_dict.get("family")
  return registry.get_family_class(own).legacy_kept if own in registry.FAMILIES else ()


def legacy_layout(config_dict: dict) -> dict:
  """The config as laid out before the families' mounts, for run ids (`nsl.scaling.cells.config_hash`),
  so the grids run before keep theirs: other families' sections dropped, the run's own family's
  options put back where `Family.legacy` says they lived (those in `Family.legacy_if_set` only
  when not at their default: the configs of then set them only to change them)."""
  from nsl.models import registry

  d = own_sections(config_dict)
  own = d.get("family")
  if own not in registry.FAMILIES:
    return d
  cls = registry.get_family_class(own)
  if cls.options is None or not cls.legacy or cls.name not in d:
    return d
  options = dict(d.pop(cls.name))
  for old, new in cls.legacy.items():
    if new == "*":
      _put(d, old, options)
      return d
    value = options.pop(new, None)
    if new not in cls.legacy_if_set or value != schema.default(cls.options, new):
      _put(d, old, value)
  changed = {k: v for k, v in options.items() if v != schema.default(cls.options, k)}  # options added since
  if changed:
    d[cls.name] = changed
  return d


def base_config() -> ml_collections.ConfigDict:
  """Every schema's section at its defaults (the module docstring)."""
  c = schema.section(Run)
  for path, schemas in mounts().items():
    if path:
      c[path] = schema.section(*schemas, **(TRUNK if Dims in schemas else {}))
  return c

