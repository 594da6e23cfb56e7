"""Scaling grids: definition files -> cells -> runs, resumable across runner kills
(docs/papers/scaling_laws.md#practice).

  python -m nsl.scaling.grid list   --grid=configs/grids/X.py
  python -m nsl.scaling.grid run    --grid=configs/grids/X.py --root=DIR|gs://BUCKET/DIR
                                    [--backend=local|tpu|slurm|ray] [--parallel=N] [--retries=2]
  python -m nsl.scaling.grid status --root=DIR|gs://BUCKET/DIR
  python -m nsl.scaling.grid rekey  --grid=configs/grids/X.py --root=DIR [--dry_run]
  python -m nsl.scaling.grid plan   --grid=configs/grids/X.py --generation=v5p   (chip-hours before booking)

A grid file defines `get_grid()` returning a dict, or a list of dicts whose cells are united:

  {"base": "configs/tiny.py",                 # config file (relative to the cwd or the repo root)
   "overrides": {"train.lr": 3e-3},           # every cell, applied before the axes
   "axes": {                                  # the Cartesian product, in this order
     "family": ["standard", "sps"],           # any config field, dotted: "model.window", "seed"
     "size": ["xs", "s"],                     # a ladder size (nsl.config.SIZES) or a dict of fields
     "tokens": [1e6, 4e6],                    # train.steps = round(tokens / (batch_size * seq_len))
     "config": ["configs/a.py", "configs/sps.py:sps_xl", ...],  # replaces "base"; labelled sps_xl
     "arm": [{"_label": "sps", "family": "sps", "model.variant": "sps"}, ...],  # several fields
     "hosts": [1], "slice": ["v5p-8"]}}       # where a cell runs (not what it trains: not hashed)

A dict value sets all its fields (its optional "_label" names it in run ids and tables); "size"
and "config" may appear inside it. A string value "@cell:LABELS" names the directory of an
earlier cell of the same grid, LABELS being its run id without the hash (its axis labels joined
by "-", e.g. "seed0-lift_rnn_s5"): runs that chain (a LIFT student and its teacher run,
`config.lift.teacher`) live in one grid. The value is hashed as "@cell:<that run id>", so the id
follows the teacher's own and not the root; the runner passes the path ROOT/<that run id> to the
launcher and starts the cell only once that cell is done (a failed one fails it). "tokens" is applied last, after batch size and seq_len are
known. A cell's run id is a readable prefix (its axis labels) plus a hash of its *effective* config
(sorted JSON of `nsl.config.to_dict` after every override, built exactly as the launcher builds
it), so the same experiment always gets the same directory, whichever grid file or axis order
produced it; changing a default in configs/base.py changes every id (a new experiment).

The runner (`nsl.scaling.runner.Runner`, through a backend of `nsl.scaling.backends`) gives every
cell ROOT/<run_id>/ with cell.json (base config and overrides), status.json (pending / running /
done / failed, attempts, times, the command), a lock while a runner owns it, launch.log, and the
run's own record files (the launcher's workdir): `nsl.scaling.cells`.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from nsl import storage
from nsl.errors import ArgumentParser, ConfigError, cli_main
from nsl.scaling import backends, runner
from nsl.scaling import plan as plan_cmd  # `plan` below is expand()'s helper
from nsl.scaling.cells import (CELL_REF, IGNORED_FIELDS, NEUTRAL_FIELDS, Cell, cell_rows, config_hash,  # noqa: F401
                               human)

SPECIAL = ("config", "size", "tokens", "hosts", "slice")
REPO_ROOT = Path(__file__).resolve().parents[2]


# -- reading grid files ---------------------------------------------------------------------------
def load_grid_file(path: str) -> list[dict]:
  """The sub-grids of a grid file (get_grid() -> dict or list of dicts), checked for shape."""
  if not os.path.isfile(path):
    raise ConfigError(f"--grid={path}: no such grid file")
  spec = importlib.util.spec_from_file_location(f"nsl_grid_{abs(hash(os.path.abspath(path)))}", path)
  module = importlib.util.module_from_spec(spec)
  from nsl import config as nsl_config
  try:
    with nsl_config.configs_package(path):  # `from configs import dd` (no sys.path entry)
      spec.loader.exec_module(module)
      grid = module.get_grid()
  except AttributeError as e:
    raise ConfigError(f"grid file {path} must define get_grid(): {e}") from e
  except Exception as e:  # a grid file is user code: say where it broke
    raise ConfigError(f"grid file {path} failed to load: {type(e).__name__}: {e}") from e
  subgrids = grid if isinstance(grid, list) else [grid]
  for i, g in enumerate(subgrids):
    where = f"grid file {path}, grid {i}"
    if not isinstance(g, dict) or set(g) - {"base", "axes", "overrides"}:
      raise ConfigError(f"{where}: expected a dict with keys base, axes, overrides; got "
                        f"{sorted(g) if isinstance(g, dict) else type(g).__name__}")
    axes = g.get("axes", {})
    if not isinstance(axes, dict) or not all(isinstance(v, (list, tuple)) and v for v in axes.values()):
      raise ConfigError(f"{where}: 'axes' must map names to non-empty lists of values")
    if not isinstance(g.get("overrides", {}), dict):
      raise ConfigError(f"{where}: 'overrides' must be a dict of field -> value")
    names_config = lambda v: isinstance(v, dict) and "config" in v
    if "base" not in g and "config" not in axes and not any(all(map(names_config, vals)) for vals in axes.values()):
      raise ConfigError(f"{where}: needs 'base' (a config file) or a 'config' axis (or an axis whose every "
                        "value sets 'config')")
  return subgrids


def resolve_config_path(spec: str, grid_path: str | None = None) -> str:
  """A config path (`FILE.py[:ARG]`) as given, else relative to the grid file's repo, else to
  nsl's repo; absolute, its argument kept, a removed path as its family file's (configs/aliases.py)."""
  from nsl import config as nsl_config

  path, arg = nsl_config.split_config_arg(spec)
  candidates = [Path(path)]
  if grid_path and not os.path.isabs(path):
    grid_dir = Path(grid_path).resolve().parent
    candidates += [p / path for p in (grid_dir, *grid_dir.parents)][:4]
  if not os.path.isabs(path):
    candidates.append(REPO_ROOT / path)
  for c in candidates:
    file, moved_arg = (str(c), arg) if c.is_file() or arg is not None else nsl_config.resolve_config(str(c))
    if os.path.isfile(file):
      arg = arg if arg is not None else moved_arg
      return str(Path(file).resolve()) + (f":{arg}" if arg is not None else "")
  raise ConfigError(f"config file {path!r} (named in grid {grid_path}) does not exist")


# -- expansion ------------------------------------------------------------------------------------
def cli_value(value: Any, field: str) -> str:
  """A Python value as the launcher's `--config.field=` string (parsed back by nsl.config)."""
  if isinstance(value, bool):
    return "true" if value else "false"
  if value is None:
    return "none"
  if isinstance(value, (str, int)):
    return str(value)
  if isinstance(value, float):
    return repr(value)
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  raise ConfigError(f"grid value {value!r} for {field!r} is not a bool, number, string, tuple or None")


def _assign(name: str, value: Any, index: int, acc: dict) -> str:
  """Applies one axis (or override) value to `acc` (config, fields, tokens); returns its label."""
  from nsl import config as nsl_config

  if isinstance(value, dict):
    for k, v in value.items():
      if k != "_label":
        _assign(k, v, index, acc)
    return str(value.get("_label", f"{name.split('.')[-1]}{index}"))
  if name == "config":
    acc["config"] = str(value)
    file, sep, arg = str(value).partition(".py:")  # FILE.py:ARG is labelled ARG
    return arg if sep else Path(file).stem
  if name == "size":
    if str(value) not in nsl_config.SIZES:
      raise ConfigError(f"grid size {value!r} is not a ladder size {sorted(nsl_config.SIZES)}; "
                        "use a dict of model fields for other sizes")
    for k, v in nsl_config.SIZES[str(value)].items():
      acc["fields"][f"model.{k}"] = v
    return str(value)
  if name == "tokens":
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
      raise ConfigError(f"grid tokens {value!r} must be a positive number")
    acc["tokens"] = float(value)
    return human(float(value))
  if name == "hosts":
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f"grid hosts {value!r} must be a positive integer (processes, one per host)")
    acc["hosts"] = value
    return f"hosts{value}"
  if name == "slice":
    acc["slice"] = str(value)
    return str(value)
  acc["fields"][name] = value
  if name in ("family", "model.variant"):
    return str(value)
  return f"{name.split('.')[-1]}{value}"


def make_run_id(labels: list[str], digest: str) -> str:
  prefix = "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", label).strip("_") for label in labels if label)
  return f"{prefix[:60]}-{digest}" if prefix else digest


def plan(subgrids: list[dict]) -> list[list[tuple[str, Any, int, bool]]]:
  """Every cell as its (name, value, index, is_axis) assignments, base and overrides first; no
  config is loaded (so a grid can be counted before its config files exist)."""
  cells = []
  for g in subgrids:
    fixed = [("config", g["base"], 0, False)] if "base" in g else []
    fixed += [(k, v, 0, False) for k, v in g.get("overrides", {}).items()]
    axes = list(g.get("axes", {}).items())
    for combo in itertools.product(*(list(enumerate(vals)) for _, vals in axes)):
      cells.append(fixed + [(name, value, i, True) for (name, _), (i, value) in zip(axes, combo)])
  return cells


def _size_name(config) -> str:
  """The ladder name when the model has a ladder size's dimensions, else dD-LL."""
  from nsl import config as nsl_config

  for name, dims in nsl_config.SIZES.items():
    if all(config.model[k] == v for k, v in dims.items()):
      return name
  return f"d{config.model.d_model}L{config.model.n_layers}"


def expand(grid_path: str, validate: bool = True) -> list[Cell]:
  """The grid's cells in definition order, deduplicated by effective config."""
  from nsl import config as nsl_config

  cells, seen = [], set()
  for assignments in plan(load_grid_file(grid_path)):
    acc: dict = {"config": None, "fields": {}, "tokens": None, "hosts": 1, "slice": ""}
    labels = []
    for name, value, index, is_axis in assignments:
      label = _assign(name, value, index, acc)
      if is_axis and name not in ("hosts", "slice"):  # placement: not in the run id either
        labels.append((name, label))
    path = resolve_config_path(acc["config"], grid_path)
    requires = _resolve_cell_refs(acc["fields"], cells, grid_path, labels)
    overrides = [(k, cli_value(v, k)) for k, v in acc["fields"].items()]
    config = nsl_config.load_config(path, overrides)
    if acc["tokens"] is not None:
      per_step = int(config.train.batch_size) * int(config.data.seq_len)
      steps = str(max(1, int(round(acc["tokens"] / per_step))))
      overrides = [(k, v) for k, v in overrides if k != "train.steps"] + [("train.steps", steps)]
      nsl_config.set_field(config, "train.steps", steps)
    if validate:
      try:
        nsl_config.validate(config)
      except ConfigError as e:
        raise ConfigError(f"grid {grid_path}, cell {dict(labels)}: {e}") from e
    digest = config_hash(nsl_config.to_dict(config))
    if digest in seen:
      continue
    seen.add(digest)
    size = dict(labels).get("size") or _size_name(config)
    t = config.train
    cells.append(Cell(
        run_id=make_run_id([lab for _, lab in labels], digest), config_path=code_relative(path),
        overrides=tuple(overrides), labels=tuple(labels), config_hash=digest, family=str(config.family),
        variant=str(config.model.variant), size=size, steps=int(t.steps),
        tokens=int(t.steps) * int(t.batch_size) * int(config.data.seq_len), requires=requires,
        hosts=acc["hosts"], slice=acc["slice"]))
  return cells


def code_relative(path: str) -> str:
  """FILE[:ARG] relative to the code root when the file lies in it: cells run from their own copy
  of the code (a Slurm node's, a Ray worker's), never from the runner's absolute paths."""
  file, sep, arg = path.partition(".py:")
  file = file + ".py" if sep else file
  try:
    rel = Path(file).resolve().relative_to(REPO_ROOT)
  except ValueError:
    return path
  return str(rel) + (f":{arg}" if sep else "")


def _resolve_cell_refs(fields: dict, earlier: list[Cell], grid_path: str, labels) -> tuple[str, ...]:
  """Rewrites each "@cell:LABELS" value to "@cell:<run id>" of the earlier cell so labelled
  (module docstring); -> the run ids this cell needs done first."""
  requires = []
  for name, value in fields.items():
    if not (isinstance(value, str) and value.startswith(CELL_REF)):
      continue
    want = value[len(CELL_REF):]
    match = [c.run_id for c in earlier if c.run_id.rsplit("-", 1)[0] == want]
    if len(match) != 1:
      known = ", ".join(sorted({c.run_id.rsplit("-", 1)[0] for c in earlier})) or "none"
      raise ConfigError(f"grid {grid_path}, cell {dict(labels)}: {name}={value!r} must name exactly one "
                        f"earlier cell by its labels ({len(match)} match; earlier cells: {known})")
    fields[name] = CELL_REF + match[0]
    requires.append(match[0])
  return tuple(requires)


def format_table(rows: list[dict]) -> str:
  head = ("run_id", "family", "size", "params", "tokens", "status", "attempts", "val_loss")
  fmt = {"params": lambda v: human(v) if v else "-", "tokens": lambda v: human(v) if v else "-",
         "val_loss": lambda v: f"{v:.4f}" if isinstance(v, (int, float)) else "-"}
  cells = [[fmt.get(k, str)(r[k]) for k in head] for r in rows]
  widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
  lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
  for r, row in zip(rows, cells):
    lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + _live(r))
  return "\n".join(lines)


def _live(row: dict) -> str:
  """A running cell's progress (or why its job waits), a failed one's error tail (`cell_rows(live=True)`)."""
  if row.get("note"):
    return f"  ({row['note']})"
  if "step" in row:
    eta = f", {row['eta_s'] / 60:.0f} min left" if "eta_s" in row else ""
    return f"  (step {row['step']}, loss {row['loss']:.4f}{eta})"
  if row.get("error"):
    return f"  ({row['error'][-200:]})"
  return ""


# -- CLI ------------------------------------------------------------------------------------------
_Parser = ArgumentParser  # one line and exit 2, like every nsl user mistake (nsl.errors)


@cli_main
def main(argv: list[str] | None = None) -> int:
  p = _Parser(prog="python -m nsl.scaling.grid", description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
  ls = sub.add_parser("list", help="print the expanded cells without running them")
  ls.add_argument("--grid", required=True, help="the grid file (configs/grids/NAME.py)")
  ls.add_argument("--json", action="store_true", help="one JSON object per cell")
  run = sub.add_parser("run", help="run every unfinished cell")
  run.add_argument("--grid", required=True, help="the grid file (configs/grids/NAME.py)")
  run.add_argument("--root", required=True, help="one directory per cell goes here: local, or gs://BUCKET/DIR "
                   "(then the bucket is all the runner and the workers share)")
  run.add_argument("--backend", default="local", choices=tuple(backends.BACKENDS),
                   help="where cells run: local subprocesses, TPU pod slices (launch/tpu_pod.sh), Slurm jobs, "
                        "Ray gangs on slices")
  run.add_argument("--parallel", type=int, default=1, help="cells at a time")
  run.add_argument("--retries", type=int, default=2, help="retries of a failed cell (from its checkpoint)")
  run.add_argument("--poll_seconds", type=float, default=1.0, help="how often the runner polls its cells")
  backends.add_arguments(run)
  st = sub.add_parser("status", help="print a table of the cells under --root (running: step, loss, time left)")
  st.add_argument("--root", required=True, help="the grid root (one directory per cell), local or gs://")
  st.add_argument("--json", action="store_true", help="one JSON object per cell")
  rk = sub.add_parser("rekey", help="move cells run under an older run id to the id the grid gives them now, "
                      "when their run recorded the same experiment (nsl.scaling.rekey)")
  rk.add_argument("--grid", required=True, help="the grid file (configs/grids/NAME.py)")
  rk.add_argument("--root", required=True, help="the grid root, local or gs://")
  rk.add_argument("--dry_run", action="store_true", help="say what would move, move nothing")
  plan_cmd.add_parser(sub)
  args = p.parse_args(argv)
  if args.command == "plan":
    return plan_cmd.main(args, expand(args.grid))
  if args.command == "status":
    root = storage.resolve(args.root)
    storage.check_bucket(root, "--root")
    rows = cell_rows(root, live=True)
    print("\n".join(json.dumps(r) for r in rows) if args.json else format_table(rows))
    return 0
  cells = expand(args.grid)
  if args.command == "list":
    for c in cells:
      if args.json:
        print(json.dumps(c.to_json(), sort_keys=True))
      else:
        needs = f"  needs={','.join(c.requires)}" if c.requires else ""
        where = f"  hosts={c.hosts}" if c.hosts > 1 else ""
        where += f"  slice={c.slice}" if c.slice else ""
        print(f"{c.run_id}  {c.family}/{c.variant}  size={c.size}  steps={c.steps}  tokens={human(c.tokens)}  "
              f"config={c.config_path}{where}{needs}")
    if not args.json:
      print(f"{len(cells)} cells")
    return 0
  root = storage.resolve(args.root)
  if args.command == "rekey":
    from nsl.scaling import rekey

    storage.check_bucket(root, "--root")
    moved = rekey.rekey(cells, root, args.dry_run)
    print(f"{moved} cell(s) {'to move' if args.dry_run else 'moved'}")
    return 0
  backend = backends.make_backend(args.backend, args, root)
  counts = runner.Runner(cells, root, backend, args.parallel, args.retries, args.poll_seconds).run()
  print(format_table(cell_rows(root, [c.run_id for c in cells])))
  return 0 if counts.get("done", 0) == len(cells) else 1


if __name__ == "__main__":
  sys.exit(main())
