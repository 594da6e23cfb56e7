"""Host memory: large XLA:CPU buffers on transparent huge pages (`ensure_huge_pages`).

XLA:CPU allocates every large temporary (a [B·S, V] logits array, a layer's attention scores)
with glibc malloc, which maps each allocation above its mmap threshold afresh and unmaps it when
freed, so every train step touches hundreds of MB of new 4 KiB pages and pays a fault per page.
On kernels whose transparent huge pages are `madvise` (the common default), glibc's
`glibc.malloc.hugetlb=1` tunable (glibc >= 2.35) advises those mappings onto 2 MiB pages: 512x
fewer faults. Measured on 2 cores (docs/benchmarks.md#huge-pages): a jitted [32, 1024, 64] Q·Kᵀ 87 -> 50 ms,
the standard tiny train step at 8x256 1.07-1.23x tokens/s, and the SPS authors' PyTorch step
gains about the same when given the same setting.

Tunables are read by the dynamic loader at process start, so the only way to set it for
`python -m nsl.launch ...` is to re-execute the same command line with it in the environment.
`nsl/__init__.py` does that (`at_startup`) for every `python -m nsl.…` command, before JAX is
imported; importing nsl as a library changes nothing. `NSL_HUGE_PAGES=0` opts out.
"""

from __future__ import annotations

import os
import sys

TUNABLE = "glibc.malloc.hugetlb"
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
OPT_OUT = "NSL_HUGE_PAGES"


def _glibc_version() -> tuple[int, int] | None:
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # "glibc 2.36"
    major, minor = version.split(".")[:2]
    return (int(major), int(minor)) if name == "glibc" else None
  except (AttributeError, ValueError, OSError):
    return None


def _thp_mode() -> str | None:
  try:
    with open(THP_MODE) as f:
      text = f.read()
  except OSError:
    return None
  return text[text.index("[") + 1:text.index("]")] if "[" in text else None


def status() -> str:
  """What this process runs with: 'on' (the tunable is set), 'always' (the kernel gives huge
  pages to every mapping), 'off' (available, not set: `at_startup` sets it), or 'off (why)'.
  Benchmarks record it next to their figures."""
  for item in os.environ.get("GLIBC_TUNABLES", "").split(":"):
    name, _, value = item.partition("=")
    if name == TUNABLE:  # the user's own setting wins, whatever it is
      return "on" if value in ("1", "2") else f"off (GLIBC_TUNABLES sets {TUNABLE}={value})"
  if os.environ.get(OPT_OUT) == "0":
    return f"off ({OPT_OUT}=0)"
  if not sys.platform.startswith("linux"):
    return "off (not Linux)"
  version = _glibc_version()
  if version is None or version < (2, 35):
    return "off (needs glibc >= 2.35)"
  mode = _thp_mode()
  if mode == "always":
    return "always"
  if mode != "madvise":
    return f"off (transparent huge pages: {mode})"
  return "off"


def nsl_module(argv: list[str]) -> str | None:
  """The module of a `python [options] -m nsl.…` command line, else None."""
  if "-m" not in argv[1:]:
    return None
  i = argv.index("-m", 1)
  module = argv[i + 1] if i + 1 < len(argv) else ""
  return module if module == "nsl" or module.startswith("nsl.") else None


def at_startup() -> None:
  """When this process is a `python -m nsl.…` command and huge pages are off but available (and
  `GLIBC_TUNABLES` does not name the tunable), re-execute the same command line with
  `GLIBC_TUNABLES` += `glibc.malloc.hugetlb=1`."""
  argv = list(getattr(sys, "orig_argv", []))
  if not argv or not sys.executable or nsl_module(argv) is None or status() != "off":
    return
  tunables = os.environ.get("GLIBC_TUNABLES", "")
  env = dict(os.environ, GLIBC_TUNABLES=f"{tunables}:{TUNABLE}=1" if tunables else f"{TUNABLE}=1")
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable] + argv[1:], env)
