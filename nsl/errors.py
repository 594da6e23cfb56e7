"""The one way user mistakes surface: an NslError whose message names the field or file.

The CLI entry points catch NslError, print its one-line message to stderr and exit with
status 2 (see `nsl.errors.cli_main`). Programming errors stay ordinary exceptions with
their tracebacks.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

EXIT_USER_ERROR = 2


class NslError(Exception):
  """A user mistake: a bad config value, a missing or corrupt file, a mesh that does not fit."""


class ConfigError(NslError):
  """An invalid or inconsistent configuration value (the message names the field)."""


class DataError(NslError):
  """A missing, corrupt or inconsistent data file (the message names the file)."""


def cli_main(fn: Callable[..., int | None]) -> Callable[..., int]:
  """Wraps a CLI main: NslError -> one line on stderr and exit status 2."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs) -> int:
    try:
      rc = fn(*args, **kwargs)
    except NslError as e:
      msg = " ".join(str(e).split("\n"))
      print(f"nsl: error: {msg}", file=sys.stderr)
      return EXIT_USER_ERROR
    return 0 if rc is None else rc

  return wrapped
