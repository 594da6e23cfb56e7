"""Every evaluator kind, defined once (docs/reference/evaluators.md).

A kind is a frozen dataclass whose fields are its schema: each field's type, default (none:
required), range or choices and one-line help sit beside it (`option`). From that one definition

  `nsl.evals.specs`     resolves and checks a `config.evals` spec into an instance of the kind,
  `add_flags`           gives the kind's stand-alone command its flags for the same fields
                        (`check_flags` their ranges), so a default or a range is written once,
  tools/docs_evaluators.py  writes the reference page (tests/evals/test_kinds.py keeps it current),

and `nsl.evals.evaluators` builds each kind's evaluator from the instance. Adding a kind is one
class here and its builder there. A field whose default means "unset" (0 for a count, "" for a
dir) says what it means (`unset`); its flag leaves the option out instead (None), so a count
given on the command line must be >= 1. A flag named otherwise than its field says so (`flag`,
e.g. nll's `batches` is `--max_batches`); `flag=None` leaves a field to the command's own flags
(nll's repeatable `--data=NAME=DIR`, zeroshot's `--task=TASK=PATH`). Kept free of JAX and of
what imports `nsl.config`: `nsl.config.validate` reads it through `nsl.evals.specs`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, ClassVar

from nsl.errors import NslError
from nsl.evals.zeroshot_tasks import READERS

REQUIRED = dataclasses.MISSING
_SAME = "="  # a flag named as its field


def option(default: Any = REQUIRED, *, help: str, minimum: float | None = None, choices: tuple = (),
           unset: str | None = None, flag: str | None = _SAME, aliases: tuple[str, ...] = (),
           flag_unset: str | None = None, instead: str = ""):
  """A field of a kind: its default (none: required), `help`, the least value of a number
  (`minimum`), the values a string may take (`choices`), what the default means when it means
  unset (`unset`; `flag_unset` where the command's omitted flag means something else), and the
  command's flag (`flag`: its name, None for none, `instead` then says what the command takes;
  `aliases`: other names it answers to)."""
  meta = {"help": help, "minimum": minimum, "choices": tuple(choices), "unset": unset,
          "flag": flag, "aliases": tuple(aliases), "flag_unset": flag_unset, "instead": instead}
  return dataclasses.field(default=default, metadata={"option": meta})


@dataclasses.dataclass(frozen=True)
class Option:
  """One field of a kind as `option` declared it, with its type (what `options` returns)."""

  name: str
  type: type
  default: Any
  help: str
  minimum: float | None
  choices: tuple
  unset: str | None
  flag: str | None
  aliases: tuple[str, ...]
  flag_unset: str | None
  instead: str

  @property
  def required(self) -> bool:
    return self.default is REQUIRED

  @property
  def flag_name(self) -> str | None:
    """The command's flag for this field, without its dashes (None: the command has its own)."""
    return self.name if self.flag == _SAME else self.flag

  @property
  def flag_default(self):
    """The flag's default: the field's, or None where the field's default means unset."""
    return None if self.unset is not None and self.type is not str else self.default

  @property
  def flag_minimum(self) -> float | None:
    return max(1, self.minimum or 0) if self.flag_default is None and self.type is int else self.minimum

  @property
  def flag_help(self) -> str:
    said = self.flag_unset or self.unset
    return f"{self.help} (default: {said})" if said else self.help


@dataclasses.dataclass(frozen=True)
class Kind:
  """What every kind declares besides its fields: its name in `config.evals`, its stand-alone
  command, whether it scores on one process's devices, and the metrics it logs."""

  kind: ClassVar[str]
  command: ClassVar[str]
  one_process: ClassVar[bool] = True
  metrics: ClassVar[str]


@dataclasses.dataclass(frozen=True)
class Nll(Kind):
  """The trainer's eval step over another data dir's split, batches of the trainer's eval size."""

  kind: ClassVar[str] = "nll"
  command: ClassVar[str] = "nsl.evals.nll"
  one_process: ClassVar[bool] = False  # each process reads its rows, as the validation NLL does
  metrics: ClassVar[str] = "`nll`"

  data: str = option(help="a data dir prepared with the run's tokenizer", flag=None,
                     instead="`--data=DIR` or `--data=NAME=DIR`, repeatable")
  split: str = option("val", help="split of each data dir to score")
  batches: int = option(0, minimum=0, help="at most this many batches per set", unset="train.eval_batches",
                        flag="max_batches", flag_unset="the whole split")


@dataclasses.dataclass(frozen=True)
class Zeroshot(Kind):
  """One zero-shot task's JSONL through lm-evaluation-harness's scorer of the run."""

  kind: ClassVar[str] = "zeroshot"
  command: ClassVar[str] = "nsl.evals.zeroshot"
  metrics: ClassVar[str] = "`acc`, `acc_norm`, … and their `_stderr`, `n`"

  task: str = option(help="the task", choices=tuple(sorted(READERS)), flag=None,
                     instead="`--task=TASK=PATH.jsonl`, repeatable")
  data: str = option(help="the task's JSONL file", flag=None, instead="`--task=TASK=PATH.jsonl`, repeatable")
  limit: int = option(0, minimum=0, help="first N examples of each task file", unset="all")
  batch_size: int = option(16, minimum=1, help="rows per forward pass")


@dataclasses.dataclass(frozen=True)
class LengthGeneralization(Kind):
  """Accuracy per sequence length (S5) or operand count (arithmetic) on the task's held-out set."""

  kind: ClassVar[str] = "length_generalization"
  command: ClassVar[str] = "nsl.evals.length_generalization"
  metrics: ClassVar[str] = "`acc_<N>` per length, `solved_to`"

  data: str = option("", help="S5 / arithmetic task dir", unset="the run's data.path",
                     flag_unset="each run's data.path")
  lengths: str = option("", help="rows, e.g. 1-16,20,32", unset="the task's")
  per_length: int = option(2000, minimum=1, help="test sequences per length")
  batch_size: int = option(2000, minimum=1, help="rows per forward pass")
  view: str = option("own", help="a named view of the run's logits (the family's; LIFT: own, bias, the states fed "
                     "at test), else the family's default view", aliases=("feed",))


@dataclasses.dataclass(frozen=True)
class Planning(Kind):
  """Exact match on the planning task's test set, decoded greedily or sampled."""

  kind: ClassVar[str] = "planning"
  command: ClassVar[str] = "nsl.evals.planning"
  metrics: ClassVar[str] = ("`accuracy`, and `first_step_acc` for path-star (the per-position `teacher_forced_acc` "
                            "is the command's)")

  data: str = option("", help="task data dir", unset="the run's data.path")
  limit: int = option(0, minimum=0, help="first N test problems only", unset="all")
  batch_size: int = option(250, minimum=1, help="test problems per decoding batch")
  temperature: float = option(0.0, minimum=0, help="0: greedy; > 0: sample the answers at this temperature "
                              "(NextLat's paper: 1.0)")
  sample_seed: int = option(0, minimum=0, help="the sampling key's seed (with temperature > 0)")


KINDS: dict[str, type[Kind]] = {k.kind: k for k in (Nll, Zeroshot, LengthGeneralization, Planning)}


def options(kind: type[Kind]) -> list[Option]:
  """The fields of `kind`, in order, as `Option`s."""
  hints = typing.get_type_hints(kind)
  return [Option(name=f.name, type=hints[f.name], default=f.default, **f.metadata["option"])
          for f in dataclasses.fields(kind)]


def add_flags(parser, kind: type[Kind]) -> None:
  """`kind`'s flags on `parser` (an argparse parser): one per field with a flag, its type,
  default and help from the field; `check_flags` checks their ranges after parsing."""
  for o in options(kind):
    if o.flag_name is not None:
      parser.add_argument(f"--{o.flag_name}", *[f"--{a}" for a in o.aliases], dest=o.flag_name, type=o.type,
                          default=o.flag_default, choices=o.choices or None, help=o.flag_help)


def check_flags(args, kind: type[Kind]) -> None:
  """NslError naming the first flag of `kind` (`add_flags`) whose value is out of its range."""
  for o in options(kind):
    value = getattr(args, o.flag_name, None) if o.flag_name is not None else None
    if value is None or o.type is str:
      continue
    if o.type is float and not math.isfinite(value):
      raise NslError(f"--{o.flag_name}={value}: must be a finite number")
    if o.flag_minimum is not None and value < o.flag_minimum:
      raise NslError(f"--{o.flag_name}={value}: must be >= {o.flag_minimum:g}")
