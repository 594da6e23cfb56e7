"""`nsl.kernels.cpu_build`: the CPU kernels' library is built once per source hash, atomically, and
a host without a compiler gets an error naming it."""

import pytest

from nsl.kernels import cpu_build


def test_build_is_cached_by_source_and_flags(tmp_path, monkeypatch):
  """A fresh cache directory gets one library named by the source hash; a second build reuses it.
  The real compiler builds the real sources, at -O0: the flags are in the key, and -O3 would spend
  ~5x the time on code this test never runs (`make install` builds the -O3 library the suite uses)."""
  monkeypatch.setenv("NSL_KERNEL_CACHE", str(tmp_path))
  monkeypatch.setattr(cpu_build, "FLAGS", tuple("-O0" if f == "-O3" else f for f in cpu_build.FLAGS))
  path = cpu_build.build()
  assert path.parent == tmp_path and path.name.startswith("nsl_cpu-") and path.stat().st_size > 0
  mtime = path.stat().st_mtime_ns
  assert cpu_build.build() == path and path.stat().st_mtime_ns == mtime
  assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left behind


def test_every_source_is_in_the_key(tmp_path, monkeypatch):
  monkeypatch.setenv("NSL_KERNEL_CACHE", str(tmp_path))
  before = cpu_build.library_path()
  copy = tmp_path / "cpu_simd.h"
  copy.write_bytes(cpu_build.HEADERS[0].read_bytes() + b"\n// changed\n")
  monkeypatch.setattr(cpu_build, "HEADERS", (copy,))
  assert cpu_build.library_path() != before


def test_a_missing_compiler_is_a_clear_build_error(tmp_path, monkeypatch):
  monkeypatch.setenv("NSL_KERNEL_CACHE", str(tmp_path))
  monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
  with pytest.raises(OSError, match="no-such-c\\+\\+"):
    cpu_build.build()
