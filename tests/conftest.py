"""Test-wide setup, set before JAX is imported.

- 8 fake CPU devices for the sharding tests.
- The suite is dominated by XLA compiles of tiny programs, not by running them, so tests compile
  with LLVM optimisation off (`--xla_backend_optimization_level=0`; same semantics, slower code
  that tiny shapes never notice) and share a persistent compilation cache
  (`.cache/jax-tests`, gitignored; keyed by the program, so stale entries are never reused): the
  many trainers of the same tiny config, and the CLI subprocesses that inherit this environment,
  compile once. Set NSL_TEST_JAX_CACHE=0 to compile everything afresh.
- tests/skipcheck.py's hooks: the skip reasons listed; under CI=true a skip caused by a missing
  extra or a file outside the repository fails the run.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if os.environ.get("NSL_TEST_JAX_CACHE", "1") != "0":
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(ROOT, ".cache", "jax-tests"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

# Every skip listed at the end of a run; in CI a skip for a missing extra or an outside file fails it.
from tests.skipcheck import (pytest_collectreport, pytest_runtest_logreport,  # noqa: E402,F401
                             pytest_sessionfinish, pytest_terminal_summary)


def pytest_collection_modifyitems(items):
  """Files holding end-to-end tests (marked slow) go first, each file kept whole: `make test`'s two
  workers take files in collection order (`--no-loadscope-reorder`), and the longest (the documented
  tiny grid, minutes) ran last, alone, while the other worker idled."""
  slow_files = {item.path for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: item.path not in slow_files)
