"""Cost a grid before booking it: `python -m nsl.scaling.grid plan --grid=FILE --generation=v5p`
(docs/guide/pods.md).

For every cell of the grid: the smallest slice of the TPU generation on which the cell's train
step compiles within the chip's HBM (`nsl.hbm`'s search, with `nsl.compile`'s own compile, but of
the step as the cell will run it: its own mesh, where -1 fills the slice, and its own
`model.remat`; a cell whose `slice` names a slice of the generation is costed on that one); that
compiled step's roofline bound (`roofline_step_seconds`: the chip's published peak FLOP/s and HBM
bandwidth, a floor no run beats); the cell's steps; and the chip-hours `step bound x steps x chips
/ 3600`, with the grid's total. Train steps only: evals, checkpoints, data loading and compiles
are not costed, so the total is a lower bound to book above.

Slices are tried smallest first; one is skipped without compiling when the mesh cannot split the
batch over it (a ConfigError of `nsl.train.program.Program`) or when the train state alone (16
bytes a parameter over the fsdp x tensor shards) exceeds the chip's HBM. The LR schedule is a
runtime argument of the train step (`nsl.train.state.Schedule`), so cells that differ only in
`train.steps` or the schedule's numbers lower to the same program: they share one compile
(`program_key`). `--cache=FILE` keeps every attempt as a JSON line, so a rerun (or an interrupted
plan of a large grid) compiles only what it has not. A cell that fits no slice is named on one
line after the table of the others, and the command exits 2. Progress, one line per compile,
goes to stderr. GPU types are not offered: `nsl.topology` builds compile-only devices for TPU
slices only.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Callable

from nsl.errors import ConfigError

# Numbers the train step takes at run time (`nsl.train.state.schedule_args`) or never reads.
RUNTIME_FIELDS = ("steps", "warmup_steps", "decay_steps", "lr", "min_lr_ratio")
STATE_BYTES_PER_PARAM = 16  # fp32 weights, gradients and two Adam moments (as nsl.hbm)


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("plan", help="smallest slice, roofline step time and chip-hours per cell")
  p.add_argument("--grid", required=True)
  p.add_argument("--generation", required=True, help="TPU generation: v4, v5p, v5e, v6e")
  p.add_argument("--max_chips", type=int, default=0, help="largest slice to consider, in chips (0: all)")
  p.add_argument("--cache", default="", help="JSON lines of compile attempts, reused by a rerun")
  p.add_argument("--json", action="store_true", help="one JSON object per cell")


def program_key(config) -> str:
  """A hash of the config without the fields the lowered train step does not depend on (the LR
  schedule's numbers and the step count: runtime arguments), so budgets of one model share it."""
  from nsl import config as nsl_config
  from nsl.scaling.cells import config_hash

  d = nsl_config.to_dict(config)
  d["train"] = {k: v for k, v in d["train"].items() if k not in RUNTIME_FIELDS}
  return config_hash(d)


def slices(generation: str, max_chips: int = 0) -> list[str]:
  """The generation's slice names, smallest first, up to `max_chips` chips (0: all)."""
  from nsl import hbm, topology

  if generation not in topology.GENERATIONS:
    gpus = [c for c in topology.CHIPS if c not in topology.GENERATIONS]
    why = (" (GPU plans are not offered: nsl.topology builds compile-only devices for TPU slices only)"
           if generation in gpus else "")
    raise ConfigError(f"--generation={generation!r}: choose a TPU generation from "
                      f"{', '.join(topology.GENERATIONS)}{why}")
  names = hbm.slices_for(generation)
  out = [n for n in names if not max_chips or _chips(n) <= max_chips]
  if not out:
    raise ConfigError(f"--max_chips={max_chips}: no {generation} slice is that small (smallest: {names[0]})")
  return out


def _chips(name: str) -> int:
  from nsl import topology

  return math.prod(topology.parse(name)[1])


class Planner:
  """The smallest fitting slice of one generation per program, compiled once per program and slice."""

  def __init__(self, generation: str, max_chips: int = 0, cache: str = "",
               progress: Callable[[str], None] | None = None):
    self.generation, self.slices, self.cache = generation, slices(generation, max_chips), cache
    self.progress = progress or (lambda line: None)
    self.attempts: dict[tuple[str, str], dict] = {}
    self.compiles = 0
    for row in _load(cache):
      self.attempts[(row["key"], row["topology"])] = row

  def search(self, config, label: str = "", only: str = "") -> tuple[dict | None, str]:
    """(the record of the smallest slice the config fits, None if none; why the last slice failed);
    `only`: the one slice to try (a cell that names its slice runs there)."""
    key = program_key(config)
    why = "no slice tried"
    for name in [only] if only else self.slices:
      record = self.attempts.get((key, name))
      if record is None:
        record = self._attempt(config, name, key, label)
      if record.get("fits"):
        return record, ""
      why = f"{name}: {record.get('skipped') or record.get('verdict')}"
    return None, why

  def _attempt(self, config, name: str, key: str, label: str) -> dict:
    from nsl import compile as nsl_compile
    from nsl import topology
    from nsl.train import program as program_lib

    sl = topology.get(name)
    base = {"key": key, "topology": name, "chips": sl.chips, "hosts": sl.hosts, "config": label}
    try:
      program = program_lib.Program(config, sl.devices)
    except ConfigError as e:
      return self._keep({**base, "fits": False, "skipped": " ".join(str(e).split())[:300]})
    _, fsdp, tensor = program.mesh.devices.shape
    state = STATE_BYTES_PER_PARAM * program.counts["params_total"] / (fsdp * tensor)
    if state > sl.generation.hbm_bytes:
      why = (f"the train state alone is {state / 2**30:.1f} GiB per chip over {fsdp * tensor} shards, over the "
             f"chip's {sl.generation.hbm_bytes / 2**30:.0f} GiB")
      return self._keep({**base, "fits": False, "skipped": why})
    t0 = time.time()
    record, _ = nsl_compile.report(config, program, sl)
    record.update(base, wall_seconds=round(time.time() - t0, 1))
    if not record["fits"]:
      record["verdict"] = f"{nsl_compile.fit_verdict(record)}; {nsl_compile.advice(config, program)}"
    self.compiles += 1
    gib = f", {record['peak_bytes'] / 2**30:.1f} GiB" if record.get("peak_bytes") is not None else ""
    self.progress(f"plan: compile {self.compiles}: {label} ({key}) on {name}, remat={record['remat']}: "
                  f"{'fits' if record['fits'] else 'does not fit'}{gib}, {record['wall_seconds']:.0f} s")
    return self._keep(record)

  def _keep(self, record: dict) -> dict:
    self.attempts[(record["key"], record["topology"])] = record
    if self.cache:
      with open(self.cache, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return record


def _load(path: str) -> list[dict]:
  if not path or not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        row = json.loads(line)
      except json.JSONDecodeError:  # the partial last line of an interrupted plan
        continue
      if isinstance(row, dict) and "key" in row and "topology" in row:
        rows.append(row)
  return rows


def step_seconds(record: dict) -> float:
  """The roofline bound, its compute term recomputed unrounded (a tiny step is microseconds)."""
  work = max(record.get("xla_flops_per_step") or 0.0, record["analytic_flops_per_step"])
  compute = work / record["chips"] / record["peak_flops_per_chip"]
  return max(compute, record["roofline_memory_seconds"])


def cell_config(cell):
  """The loaded config of a grid `Cell` (its path relative to nsl's checkout, or absolute)."""
  from nsl import config as nsl_config
  from nsl.scaling.griddata import code_path

  return nsl_config.load_config(code_path(cell.config_path), list(cell.overrides))


def named_slice(cell, generation: str) -> str:
  """The cell's own `slice` when it is a slice of `generation` (`grid plan` costs it there), else ""."""
  from nsl import topology

  name = getattr(cell, "slice", "") or ""
  try:
    return name if name and topology.parse(name)[0].name == generation else ""
  except ConfigError:  # a backend's group name, not a TPU slice
    return ""


_PLANNERS: dict[tuple[str, str], Planner] = {}


def smallest_slice(cell_config_or_cell, generation: str, cache: str = "") -> str:
  """The smallest slice of `generation` the cell (a `Cell` or a loaded config) fits, e.g.
  "v5p-8": the Ray backend's default for a cell without `slice`. Compiles once per program per
  process (`cache`: a `grid plan --cache` file, read and extended); a cell that fits none raises
  ConfigError."""
  config = cell_config_or_cell
  if hasattr(config, "overrides") and hasattr(config, "config_path"):
    config = cell_config(config)
  planner = _PLANNERS.setdefault((generation, cache), Planner(generation, cache=cache))
  record, why = planner.search(config)
  if record is None:
    raise ConfigError(f"the cell fits no {generation} slice ({why})")
  return record["topology"]


def plan_rows(cells, planner: Planner) -> tuple[list[dict], list[tuple[str, str]]]:
  """One row per fitting cell; (run id, why) per cell that fits no slice."""
  rows, misfits = [], []
  for cell in cells:
    record, why = planner.search(cell_config(cell), label=cell.run_id, only=named_slice(cell, planner.generation))
    if record is None:
      misfits.append((cell.run_id, why))
      continue
    step = step_seconds(record)
    rows.append({"run_id": cell.run_id, "slice": record["topology"], "chips": record["chips"],
                 "hosts": record["hosts"], "remat": record["remat"], "mesh": record["mesh"],
                 "peak_gib": round(record["peak_bytes"] / 2**30, 2), "step_seconds": step,
                 "bound": record["roofline_bound"], "mfu_bound": record["roofline_mfu"], "steps": cell.steps,
                 "tokens": cell.tokens, "chip_hours": step * cell.steps * record["chips"] / 3600,
                 "program": record["key"]})
  return rows, misfits


def format_table(rows: list[dict], generation: str) -> str:
  from nsl.scaling.cells import human

  head = ("run_id", "slice", "hosts", "remat", "peak_GiB", "step_s", "bound", "steps", "chip_hours")
  cells = [[r["run_id"], r["slice"], str(r["hosts"]), r["remat"], f"{r['peak_gib']:.1f}",
            f"{r['step_seconds']:.3g}", r["bound"], str(r["steps"]), f"{r['chip_hours']:.4g}"] for r in rows]
  widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
  lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
  lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
  total = sum(r["chip_hours"] for r in rows)
  lines.append(f"total: {len(rows)} cells, {total:.4g} {generation} chip-hours, "
               f"{human(sum(r['tokens'] for r in rows))} tokens (roofline bound of the train steps)")
  return "\n".join(lines)


def main(args, cells) -> int:
  """`grid plan`: the table (or JSON lines) of the grid's `cells` (expanded by `nsl.scaling.grid`);
  exit 2 when a cell fits nowhere."""
  if args.max_chips < 0:
    raise ConfigError(f"--max_chips={args.max_chips} must be 0 (all slices) or positive")
  planner = Planner(args.generation, args.max_chips, args.cache,
                    progress=lambda line: print(line, file=sys.stderr, flush=True))
  rows, misfits = plan_rows(cells, planner)
  if args.json:
    for r in rows:
      print(json.dumps(r, sort_keys=True))
  else:
    print(format_table(rows, args.generation))
  sys.stdout.flush()
  if misfits:
    largest = planner.slices[-1]
    named = "; ".join(f"{run_id} ({why})" for run_id, why in misfits)
    raise ConfigError(f"{len(misfits)} cell(s) fit no {args.generation} slice up to {largest}: {named}")
  return 0
