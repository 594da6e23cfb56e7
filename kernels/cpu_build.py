"""Builds and loads nsl's C++ CPU kernels (`flash_cpu.cc`, `head_cpu.cc`, `decode_cpu.cc`, `cpu_simd.h`) as one library.

Build: `c++ -O3 -march=native` (`$CXX` overrides the compiler) against jaxlib's FFI headers, into
`$NSL_KERNEL_CACHE` (default `~/.cache/nsl/kernels`), named by a hash of the sources, the flags,
the jaxlib version and the CPU's feature flags, written atomically so concurrent processes share
one build (`python -m nsl.kernels.cpu_build`, run when `make` installs nsl, builds it ahead of
time and prints where; otherwise the first use builds it). A host that cannot build it (no
compiler) warns once on stderr per kernel and runs the XLA paths.

`$NSL_CPU_THREADS` (a positive integer) caps the workers of every kernel call (default: the cores
the process may run on). The kernels' results do not depend on it (docs/guide/determinism.md).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax

from nsl.errors import ConfigError

HERE = Path(__file__).parent
SOURCES = (HERE / "flash_cpu.cc", HERE / "head_cpu.cc", HERE / "decode_cpu.cc")
HEADERS = (HERE / "cpu_simd.h",)
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fno-math-errno",
         "-Wno-attributes", "-Wno-return-type", "-pthread")
# FFI target name -> the handler symbol the library exports
TARGETS = {"nsl_flash_cpu_fwd": "NslFlashCpuFwd", "nsl_flash_cpu_bwd": "NslFlashCpuBwd",
           "nsl_head_cpu": "NslHeadCpu", "nsl_decode_cpu": "NslDecodeCpu",
           "nsl_decode_cpu_write": "NslDecodeCpuWrite",
           "nsl_decode_matmul_cpu": "NslDecodeMatmulCpu"}


def cache_dir() -> Path:
  env = os.environ.get("NSL_KERNEL_CACHE")
  if env:
    return Path(env)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "nsl" / "kernels"


def _compiler() -> str:
  cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
  if not cxx:
    raise OSError("no C++ compiler (set $CXX or install g++)")
  return cxx


def _host_features() -> str:
  """The CPU's feature flags: `-march=native` code must not run on a host without them (a cache
  directory shared between machines)."""
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith("flags")), platform.machine())
  except OSError:
    return platform.machine() + platform.processor()


def library_path() -> Path:
  """Where the build for these sources, flags, this jaxlib and this CPU lives (built or not)."""
  import jaxlib
  key = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS) + " ".join(FLAGS).encode()
                       + jaxlib.__version__.encode() + _host_features().encode())
  return cache_dir() / f"nsl_cpu-{key.hexdigest()[:16]}.so"


def build() -> Path:
  """Compiles the kernel library if it is not cached yet; returns its path."""
  path = library_path()
  if path.exists():
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
  os.close(fd)
  cmd = [_compiler(), *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", tmp]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
      raise OSError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-2000:]}")
    os.replace(tmp, path)  # atomic: a concurrent build of the same sources lands the same bytes
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return path


THREADS_ENV = "NSL_CPU_THREADS"


def check_threads() -> None:
  """A non-empty `$NSL_CPU_THREADS` must be a positive integer (the kernels would ignore anything else)."""
  value = os.environ.get(THREADS_ENV, "").strip()
  if value and not (value.isdigit() and int(value) > 0):
    raise ConfigError(f"{THREADS_ENV}={value!r} must be a positive integer (the CPU kernels' workers); "
                      "unset it to use every core")


@functools.lru_cache(maxsize=None)
def load() -> str | None:
  """Builds, loads and registers every FFI target once per process; the failure reason or None."""
  check_threads()
  try:
    lib = ctypes.cdll.LoadLibrary(str(build()))
  except OSError as e:
    return str(e)
  for target, symbol in TARGETS.items():
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  return None


@functools.lru_cache(maxsize=None)
def constant(symbol: str) -> int | None:
  """An int a kernel exports as `extern "C" int symbol()` (a build constant, e.g. its vector
  width), or None when the library is unavailable."""
  if load() is not None:
    return None
  return int(getattr(ctypes.cdll.LoadLibrary(str(library_path())), symbol)())


def _main() -> None:
  """`python -m nsl.kernels.cpu_build`: build the kernels now (install step); prints the path."""
  from nsl.errors import ArgumentParser

  ArgumentParser(prog="python -m nsl.kernels.cpu_build").parse_args()  # described by the module docstring
  try:
    print(build())
  except OSError as e:
    raise SystemExit(f"nsl.kernels.cpu_build: build failed: {e}")


if __name__ == "__main__":
  _main()
