"""One registry of nsl's kernels: which backend runs an attention, the output head with its loss,
a decode step's cached attention and its few-row products (docs/design.md#kernels).

Every backend is one `Backend` entry of a kind (`KINDS`) that declares where `auto` may run it
(its platforms), which mask rules it takes (`RULES`: a rule must use only these), an
availability check (the module imports, the C++ library builds) and a shape check (its module's
`supports`). `pick` returns, for one call, the first entry of the kind in registration order
that runs on the traced program's platform, is usable and takes the call, else the kind's
fallback (the XLA path, which takes everything). `model.attention_impl`'s names are the
attention kind's keys (`names`), `auto` included.

The XLA paths are entries with no module: they live in `nsl.nn` (above this floor), which runs
them when `pick` names them. The kernel modules do not import this one: it imports them, lazily.

`use(cpu_kernels=False)` (the trainer enters it from `model.cpu_kernels`) makes every C++ CPU
kernel unusable while it is in force, so what is traced meanwhile runs the XLA paths everywhere;
jit's cache keys on it. `record()` collects what `pick` chose while it is in force
(`Program.describe`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
from typing import Callable, Iterator

import jax
from jax._src import config as jax_config

from nsl.errors import ConfigError

KINDS = ("attention", "head", "decode", "matmul")
# The parts of an `nsl.nn.masks.Rule` a backend may or may not take (`rule_parts`).
RULES = frozenset({"causal", "segment", "window", "persistent_window", "block_same", "block_earlier"})
NO_BLOCKS = RULES - {"block_same", "block_earlier"}


def rule_parts(rule) -> frozenset[str]:
  """The parts of `RULES` that `rule` (an `nsl.nn.masks.Rule`) uses."""
  parts = {"causal": rule.causal, "segment": rule.same_segment, "window": rule.window is not None,
           "persistent_window": rule.persistent_window is not None, "block_same": rule.block == "same",
           "block_earlier": rule.block == "earlier"}
  return frozenset(name for name, used in parts.items() if used)


@dataclasses.dataclass(frozen=True)
class Backend:
  """One backend of one kind of kernel."""

  kind: str
  name: str
  summary: str
  # Where `auto` tries it ("cpu", "gpu", "tpu": the traced program's platform); () for the XLA
  # paths, which run anywhere but only when named or as the fallback.
  platforms: tuple[str, ...] = ()
  fallback: bool = False  # what `pick` returns when no kernel takes a call (one per kind)
  rules: frozenset[str] = RULES  # the mask rules it takes (attention and decode attention)
  module: str | None = None  # `nsl.kernels.<module>`, imported on first use; None: an XLA path
  supports_fn: str = "supports"  # the module's shape check
  cpu_kernel: bool = False  # a C++ CPU kernel: unusable under `use(cpu_kernels=False)`
  lse_grad: bool = True  # attention: its lse has a gradient (else `need_lse` refuses the call)

  def load(self):
    """The kernel's module; a ConfigError naming the backend when it cannot be imported here."""
    try:
      return importlib.import_module(f"nsl.kernels.{self.module}")
    except ImportError as e:
      raise ConfigError(f"the {self.kind} backend {self.name!r} is unavailable here ({e}); "
                        f"use {fallback_name(self.kind)!r}") from e

  def available(self) -> bool:
    """Whether it can run in this process: an XLA path always; a kernel when its module imports
    and its own `available()` (a build, a device) says so."""
    if self.module is None:
      return True
    try:
      mod = self.load()
    except ConfigError:
      return False
    check = getattr(mod, "available", None)
    return True if check is None else bool(check())

  def usable(self) -> bool:
    """Available, and not a CPU kernel switched off (`use`)."""
    return not (self.cpu_kernel and not cpu_kernels()) and self.available()

  def takes_rule(self, rule) -> bool:
    return rule_parts(rule) <= self.rules

  def supports(self, *args, **kwargs) -> bool:
    """The module's shape check (an XLA path takes every call)."""
    return True if self.module is None else bool(getattr(self.load(), self.supports_fn)(*args, **kwargs))


_REGISTRY: dict[tuple[str, str], Backend] = {}


def register(backend: Backend) -> Backend:
  if backend.kind not in KINDS:
    raise ValueError(f"kernel kind {backend.kind!r} is not one of {KINDS}")
  if (backend.kind, backend.name) in _REGISTRY:
    raise ValueError(f"the {backend.kind} backend {backend.name!r} is registered twice")
  if backend.fallback and (backend.platforms or backend.module or any(b.fallback for b in backends(backend.kind))):
    raise ValueError(f"{backend.name!r}: a kind has one fallback, an XLA path (no module) on no platform")
  _REGISTRY[(backend.kind, backend.name)] = backend
  return backend


def backends(kind: str) -> tuple[Backend, ...]:
  """The kind's entries in registration order (`auto`'s order within a platform)."""
  return tuple(b for (k, _), b in _REGISTRY.items() if k == kind)


def names(kind: str) -> tuple[str, ...]:
  return tuple(b.name for b in backends(kind))


def get(kind: str, name: str) -> Backend:
  """The entry `name` of `kind`; a ConfigError listing the valid names otherwise."""
  if (kind, name) not in _REGISTRY:
    raise ConfigError(f"{name!r} is not a {kind} backend; one of {names(kind)}")
  return _REGISTRY[(kind, name)]


def fallback_name(kind: str) -> str:
  return next(b.name for b in backends(kind) if b.fallback)


def general(kind: str, platform: str, usable: Callable[[Backend], bool] = Backend.usable) -> str:
  """The platform's kernel of `kind` that takes the most rules (first in order on a tie) and is
  `usable`, else the fallback: what one name for a whole model says (`pallas_gpu` on GPU, where
  `auto` also runs cuDNN per call on the rules cuDNN takes)."""
  found = [b for b in backends(kind) if platform in b.platforms and usable(b)]
  return max(found, key=lambda b: len(b.rules), default=get(kind, fallback_name(kind))).name


def platform() -> str:
  from nsl import sharding  # the traced program's platform (the context mesh's), not the host's
  return sharding.platform()


def pick(kind: str, takes: Callable[[Backend], bool], platform_name: str | None = None,
         usable: Callable[[Backend], bool] = Backend.usable) -> str:
  """The first entry of `kind` that runs on the platform (default: the traced program's), is
  `usable` and `takes(entry)` the call; else the kind's fallback. Recorded (`record`)."""
  where = platform_name or platform()
  chosen = next((b.name for b in backends(kind) if where in b.platforms and usable(b) and takes(b)),
                None) or fallback_name(kind)
  return note(kind, chosen)


def note(kind: str, name: str) -> str:
  """Records a choice (`record`): `pick`'s, and a call that names its backend."""
  for picks in _recorders.get():
    picks.add(kind, name)
  return name


def pick_call(kind: str, *args, **kwargs) -> str:
  """`pick` with each entry's own shape check on these arguments (head, decode, matmul)."""
  return pick(kind, lambda b: b.supports(*args, **kwargs))


def require(kind: str, name: str) -> Backend:
  """An explicit choice (`model.attention_impl=flash_cpu`): the entry, or a ConfigError when it
  cannot run here at all."""
  b = get(kind, name)
  if b.cpu_kernel and not cpu_kernels():
    raise ConfigError(f"model.attention_impl={name!r} is a C++ CPU kernel and model.cpu_kernels is "
                      f"False; set model.cpu_kernels=True or choose {fallback_name(kind)!r}")
  if b.module is not None:
    b.load()
  return b


# ----------------------------------------------------------------------------- switches, records

# The switch is a JAX config state that jit's cache keys on, so a function jitted once retraces
# when it is called under the other setting instead of replaying the kernels it picked before.
# `jax._src.config.bool_state` is private API (checked against jax 0.10.2); its environment
# variable, NSL_CPU_KERNELS=0, sets the process's default.
_CPU_KERNELS = jax_config.bool_state(
    "nsl_cpu_kernels", True, "Whether nsl's kernel registry may pick the C++ CPU kernels.",
    include_in_jit_key=True, include_in_trace_context=True)
_recorders: contextvars.ContextVar[tuple["Picks", ...]] = contextvars.ContextVar("nsl_kernel_picks", default=())


def use(cpu_kernels: bool = True):
  """A context manager: while in force, `cpu_kernels=False` leaves every C++ CPU kernel out of
  `pick` (the `model.cpu_kernels` switch), so what is traced meanwhile runs the XLA paths."""
  return _CPU_KERNELS(bool(cpu_kernels))


def set_default(cpu_kernels: bool) -> None:
  """The process-wide setting (`use` overrides it within a block): what a command that loads a
  run (`nsl.runs.load_run`: generation, evaluations, decoding benchmarks) sets from the run's
  `model.cpu_kernels`, so it decodes and scores on the kernels the run trained with."""
  jax.config.update("nsl_cpu_kernels", bool(cpu_kernels))


def cpu_kernels() -> bool:
  """Whether the C++ CPU kernels may be picked now (`use`)."""
  return bool(_CPU_KERNELS.value)


@dataclasses.dataclass
class Picks:
  """What `pick` chose per kind while a `record()` was in force, each name once, in order."""

  chosen: dict[str, list[str]] = dataclasses.field(default_factory=dict)

  def add(self, kind: str, name: str) -> None:
    seen = self.chosen.setdefault(kind, [])
    if name not in seen:
      seen.append(name)

  def summary(self) -> dict[str, str]:
    """kind -> the names it picked joined by '+' in registration order (e.g. 'cudnn+pallas_gpu')."""
    order = lambda kind: [n for n in names(kind) if n in self.chosen[kind]]
    return {kind: "+".join(order(kind)) for kind in KINDS if kind in self.chosen}


@contextlib.contextmanager
def record() -> Iterator[Picks]:
  """Collects what `pick` chooses while in force (nested records each see every choice)."""
  picks = Picks()
  token = _recorders.set(_recorders.get() + (picks,))
  try:
    yield picks
  finally:
    _recorders.reset(token)


# ----------------------------------------------------------------------------- the backends
# Registration order is `auto`'s order on each platform: splash on TPU; cuDNN, then the Pallas
# kernel on GPU; the C++ kernel on CPU; the chunked XLA path for whatever none of them takes. The
# XLA paths come last, so a summary reads kernels first ("splash+chunked").

for _b in (
    Backend("attention", "splash", "Pallas splash attention, the rule as a computable mask",
            platforms=("tpu",), rules=RULES - {"block_earlier"}, module="splash"),
    Backend("attention", "cudnn", "cuDNN's fused attention: the plain token layout, causal, windows, documents",
            platforms=("gpu",), rules=NO_BLOCKS, module="cudnn", lse_grad=False),
    Backend("attention", "pallas_gpu", "Pallas (Triton) block-sparse flash attention, every rule",
            platforms=("gpu",), module="flash_gpu"),
    Backend("attention", "flash_cpu", "the C++ block-sparse flash attention (float32, head dims of 16s)",
            platforms=("cpu",), rules=NO_BLOCKS, module="flash_cpu", cpu_kernel=True),
    Backend("attention", "xla", "the dense reference: the whole [Sq, Sk] mask, one softmax"),
    Backend("attention", "chunked", "exact attention over the non-empty tiles only, in XLA",
            fallback=True),
    Backend("head", "head_cpu", "the C++ tied head fused with its cross-entropy, on one CPU device",
            platforms=("cpu",), rules=frozenset(), module="head_cpu", cpu_kernel=True),
    Backend("head", "xla", "the head and cross-entropy in chunks of rows, in XLA", rules=frozenset(),
            fallback=True),
    Backend("decode", "decode_cpu", "the C++ cached attention of a decode step (1-16 queries)",
            platforms=("cpu",), module="decode_cpu", cpu_kernel=True),
    Backend("decode", "xla", "the cached attention in XLA, cache and new keys scored apart", fallback=True),
    Backend("matmul", "decode_cpu", "the C++ few-row product of a decode step (at most 32 rows)",
            platforms=("cpu",), rules=frozenset(), module="decode_cpu", supports_fn="supports_matmul",
            cpu_kernel=True),
    Backend("matmul", "xla", "XLA's dot", rules=frozenset(), fallback=True),
):
  register(_b)
