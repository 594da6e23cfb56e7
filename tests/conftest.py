"""Test-wide setup: 8 fake CPU devices for sharding tests (set before JAX is imported)."""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
