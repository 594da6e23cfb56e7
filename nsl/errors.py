"""The one way user mistakes surface: an NslError whose message names the field or file.

The CLI entry points catch NslError, print its one-line message to stderr and exit with
status 2 (see `nsl.errors.cli_main`). Programming errors stay ordinary exceptions with
their tracebacks. Two environment failures are user-facing too and get the same treatment:
a full disk (any `OSError` with ENOSPC/EDQUOT in the exception chain: one line naming the file,
its directory's free bytes and, where known, the bytes needed) and argparse mistakes (one line
with a short usage hint, via `nsl.errors.ArgumentParser`).

`nsl.errors.ArgumentParser` is also what every command's `--help` looks like: its module docstring
whole, as written, and every option's default (docs/reference/cli.md is generated from that help).
"""

from __future__ import annotations

import argparse
import copy
import errno
import functools
import inspect
import os
import shutil
import sys
import textwrap
from typing import Callable

EXIT_USER_ERROR = 2
_DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class NslError(Exception):
  """A user mistake: a bad config value, a missing or corrupt file, a mesh that does not fit."""


class ConfigError(NslError):
  """An invalid or inconsistent configuration value (the message names the field)."""


class DataError(NslError):
  """A missing, corrupt or inconsistent data file (the message names the file)."""


class UsageError(NslError):
  """A command-line mistake caught by argparse (unknown flag, missing or invalid argument)."""


class DiskFullError(NslError):
  """No space left where nsl writes (the message names the directory and the bytes)."""


def _free_bytes(path: str | None) -> int | None:
  path = path or "."
  while path and not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  try:
    return shutil.disk_usage(path or ".").free
  except OSError:
    return None


def disk_full_cause(exc: BaseException) -> OSError | None:
  """The ENOSPC/EDQUOT OSError in `exc`'s chain (cause / context), or None."""
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
      return exc
    if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
      return exc if isinstance(exc, OSError) else OSError(errno.ENOSPC, str(exc).splitlines()[0][:200])
    exc = exc.__cause__ or exc.__context__
  return None


def disk_full_error(cause: OSError, where: str | None = None, needed: int | None = None) -> DiskFullError:
  """A one-line DiskFullError for `cause`: the file or directory, free bytes, bytes needed."""
  path = where or getattr(cause, "filename", None) or "."
  directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
  free = _free_bytes(directory)
  need = f", about {needed:,} bytes needed" if needed else ""
  have = f"{free:,} bytes free" if free is not None else "free space unknown"
  return DiskFullError(f"disk full writing {path} ({have} in {directory}{need}); free space there "
                       "or use another directory, then rerun the same command (it resumes)")


def cli_main(fn: Callable[..., int | None]) -> Callable[..., int]:
  """Wraps a CLI main: NslError (and a full disk) -> one line on stderr and exit status 2."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs) -> int:
    try:
      rc = fn(*args, **kwargs)
    except NslError as e:
      _print_error(e)
      return EXIT_USER_ERROR
    except Exception as e:
      cause = disk_full_cause(e)
      if cause is None:
        raise
      _print_error(disk_full_error(cause))
      return EXIT_USER_ERROR
    return 0 if rc is None else rc

  return wrapped


def _print_error(e: BaseException) -> None:
  msg = " ".join(str(e).split())
  print(f"nsl: error: {msg}", file=sys.stderr, flush=True)


def warn(msg: str) -> None:
  """A one-line warning on stderr (recoverable damage, e.g. a checkpoint skipped)."""
  print(f"nsl: warning: {' '.join(str(msg).split())}", file=sys.stderr, flush=True)


def _shows_default(action: argparse.Action) -> bool:
  """An option whose default says something: not a flag's False, nor None, '' or an empty list."""
  d = action.default
  empty = d is None or d is False or d is argparse.SUPPRESS or (isinstance(d, (str, list, tuple, dict)) and not d)
  return bool(action.option_strings) and not empty


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  """The description as written (a module docstring keeps its usage lines and tables) and every
  option's default, also for an option without a help string."""

  def _get_help_string(self, action):
    text = action.help or ""
    if "%(default)" in text or "(default" in text or not _shows_default(action):  # or it says it in words
      return text
    return f"{text} (default: %(default)s)".strip()

  def _split_lines(self, text, width):  # a long default (a list of configs) stays whole: it can be copied
    return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)

  def _format_action(self, action):
    if not action.help and _shows_default(action):  # argparse prints no help line at all otherwise
      action = copy.copy(action)
      action.help = "(default: %(default)s)"
    return super()._format_action(action)


def module_doc(prog: str | None) -> str | None:
  """The docstring of the module a `python -m MODULE` prog runs (imported already: it is running)."""
  words = (prog or "").split()
  if len(words) != 3 or words[:2] != ["python", "-m"]:
    return None
  for module in list(sys.modules.values()):
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.name == words[2] and module.__doc__:
      return inspect.cleandoc(module.__doc__)
  return None


class ArgumentParser(argparse.ArgumentParser):
  """argparse whose mistakes are one-line UsageErrors (exit 2 through `cli_main`), not the
  multi-line usage block; `--help` still prints the full help: with `HelpFormatter`, and for a
  `python -m MODULE` prog the module's whole docstring as the description, also where the caller
  passes only its first line (a description that is not the docstring's beginning is kept)."""

  def __init__(self, *args, description: str | None = None, **kwargs):
    kwargs.setdefault("formatter_class", HelpFormatter)
    super().__init__(*args, **kwargs)
    doc = module_doc(self.prog)
    given = " ".join((description or "").split())
    if doc and " ".join(doc.split()).startswith(given):
      description = doc
    self.description = description

  def error(self, message):
    raise UsageError(f"{self.prog}: {message} (usage: {self.short_usage()}; --help for all options)")

  def short_usage(self) -> str:
    required = [a for a in self._actions if a.required and a.option_strings]
    parts = [self.prog] + [f"{a.option_strings[-1]}={a.metavar or a.dest.upper()}" for a in required]
    for a in self._actions:
      if not a.option_strings and a.dest != "help":
        parts.append("{" + ",".join(a.choices) + "}" if isinstance(a.choices, dict) else (a.metavar or a.dest))
    if any(not a.required and a.option_strings and a.dest != "help" for a in self._actions):
      parts.append("[options]")
    return " ".join(parts)
