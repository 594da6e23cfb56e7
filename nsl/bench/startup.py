"""What a fresh process pays before its first line of work: the import of the heavy modules that
every nsl command, grid cell and test subprocess loads (docs/benchmarks.md#current).

  python -m nsl.bench.startup [--modules=ml_dtypes,jax,nsl.train.loop] [--rounds=5]

Each round starts one fresh interpreter per module (in turn, so drift hits every module alike) that
times `import MODULE` after numpy is loaded (CPU seconds of the process, every thread, and wall
seconds), and prints one JSON line per module with the medians and the installed versions of
jax, jaxlib and ml_dtypes. A module's figure includes what it imports first (jax includes
ml_dtypes). The reason it exists: ml_dtypes 0.7.0's extension spends ~0.75 CPU-s initialising,
which pyproject's `ml-dtypes<0.7` avoids.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from nsl.errors import ArgumentParser, NslError, cli_main

_PROBE = """
import json, sys, time
import numpy
c, w = time.process_time(), time.perf_counter()
__import__(sys.argv[1])
print(json.dumps({"cpu_s": time.process_time() - c, "wall_s": time.perf_counter() - w}))
"""


def probe(module: str) -> dict:
  """One fresh interpreter's import of `module`: {"cpu_s", "wall_s"}."""
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  proc = subprocess.run([sys.executable, "-c", _PROBE, module], capture_output=True, text=True, env=env)
  if proc.returncode != 0:
    last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise NslError(f"--modules: `import {module}` failed in a fresh interpreter: {last}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def versions() -> dict:
  from importlib import metadata

  out = {}
  for dist in ("jax", "jaxlib", "ml_dtypes", "numpy"):
    try:
      out[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
      out[dist] = None
  return out


def run(modules: list[str], rounds: int) -> list[dict]:
  samples = {m: [] for m in modules}
  for _ in range(rounds):
    for m in modules:
      samples[m].append(probe(m))
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
  return [{"bench": "startup", "module": m, "rounds": rounds,
           "import_cpu_s": statistics.median(s["cpu_s"] for s in samples[m]),
           "import_wall_s": statistics.median(s["wall_s"] for s in samples[m]),
           "load1": load, **versions()} for m in modules]


@cli_main
def main(argv=None) -> int:
  p = ArgumentParser(prog="python -m nsl.bench.startup", description=__doc__.split("\n")[0])
  p.add_argument("--modules", default="ml_dtypes,jax,nsl.train.loop", help="comma-separated modules to time")
  p.add_argument("--rounds", type=int, default=5, help="fresh interpreters per module (medians)")
  a = p.parse_args(argv)
  if a.rounds < 1:
    raise NslError(f"--rounds={a.rounds}: must be at least 1")
  modules = [m.strip() for m in a.modules.split(",") if m.strip()]
  if not modules:
    raise NslError("--modules is empty: name at least one module, e.g. --modules=jax")
  for row in run(modules, a.rounds):
    print(json.dumps(row))
  return 0


if __name__ == "__main__":
  sys.exit(main())
