"""Every shipped config's and grid cell's run id (nsl.scaling.cells.config_hash), as JSON.

  python tools/run_ids.py > before.json   # then change the config layout
  python tools/run_ids.py --check before.json

A change of how options are laid out in a config (docs/reference/config.md) must leave the ids of
the grids users already ran unchanged, or say which; `--check` lists every id that moved.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ids() -> dict[str, str]:
  from nsl import config as nsl_config
  from nsl.scaling import cells, grid

  out = {}
  for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))):
    name = os.path.relpath(path, ROOT)
    if os.path.basename(path) in ("__init__.py", "aliases.py", "base.py"):
      continue
    args = _args(path)
    for arg in args or (None,):
      spec = name if arg is None else f"{name}:{arg}"
      out[spec] = cells.config_hash(nsl_config.to_dict(nsl_config.load_config(os.path.join(ROOT, spec))))
  for path in sorted(glob.glob(os.path.join(ROOT, "configs", "grids", "*.py"))):
    for cell in grid.expand(path, validate=False):
      out[f"{os.path.relpath(path, ROOT)}#{cell.run_id.rsplit('-', 1)[0]}"] = cell.config_hash
  return out


def _args(path: str) -> tuple[str, ...]:
  """The config file's `ARGS` (the arguments it takes; () for one that takes none)."""
  import importlib.util

  from nsl import config as nsl_config

  spec = importlib.util.spec_from_file_location("run_ids_config", path)
  module = importlib.util.module_from_spec(spec)
  with nsl_config.configs_package(path):
    spec.loader.exec_module(module)
  return tuple(getattr(module, "ARGS", ()))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--check", default="", help="a JSON of ids from before: list every one that moved, exit 1 if any")
  args = p.parse_args(argv)
  now = ids()
  if not args.check:
    json.dump(now, sys.stdout, indent=1, sort_keys=True)
    print()
    return 0
  before = json.load(open(args.check))
  moved = {k: (v, now.get(k)) for k, v in before.items() if now.get(k) != v}
  for k, (a, b) in sorted(moved.items()):
    print(f"{k}: {a} -> {b}")
  print(json.dumps({"compared": len(before), "moved": len(moved)}))
  return 1 if moved else 0


if __name__ == "__main__":
  sys.exit(main())
