"""`grid rekey`: move a grid's cells that ran under an older run id to the id the grid gives them now
(docs/reference/grid_files.md#run-ids).

A run id ends in a hash of the cell's effective config. When nsl changes how that hash is taken
(a config layout moved, `nsl.options.legacy_layout`) a few cells of an old root get new ids, and
`grid run` would train them again beside their finished directories. For each cell of the grid
whose directory is missing, `rekey` looks for a directory of the same labels (the run id without
its hash) whose run recorded the same experiment: its config.json, read in today's layout
(`nsl.options.upgraded`), equal to the cell's effective config in every field but placement (the
data dir the runner placed, logging, profiling, the timed saves; a field naming another cell by
"@cell:", which moves with it). That directory is renamed to the new id and its cell.json and
status.json rewritten; nothing else in it names its id. A directory of the same labels but another
experiment, or one whose runner still holds it, is left where it is and said so.
"""

from __future__ import annotations

import os

from nsl import config as nsl_config
from nsl import options, storage
from nsl.scaling.cells import (CELL_FILE, CELL_REF, LOCK_FILE, STATUS_FILE, Cell, cell_ids, read_json,
                               update_status, write_json)
from nsl.scaling.locks import CellLock

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Where a cell runs and what it logs, not what it trains (`nsl.scaling.cells.IGNORED_FIELDS`, the data placement).
PLACEMENT = ("data.path", "log", "train.profile_steps", "checkpoint.every_minutes")


def _comparable(config_dict: dict) -> dict:
  flat = nsl_config.flatten(options.own_sections(options.upgraded(config_dict)))
  return {k: v for k, v in flat.items() if not any(k == p or k.startswith(p + ".") for p in PLACEMENT)}


def same_experiment(saved: dict, cell: Cell) -> str | None:
  """None when the run that wrote `saved` (its config.json) is `cell`'s experiment, else the first
  field that differs."""
  path = cell.config_path if os.path.isabs(cell.config_path.split(".py:")[0]) else os.path.join(REPO_ROOT, cell.config_path)
  now = _comparable(nsl_config.to_dict(nsl_config.load_config(path, list(cell.overrides))))
  was = _comparable(saved)
  for field in sorted(set(now) | set(was)):
    if isinstance(now.get(field), str) and now[field].startswith(CELL_REF):
      continue  # names another cell's directory, which moves with that cell
    if now.get(field) != was.get(field):
      return field
  return None


def moves(cells: list[Cell], root: str) -> tuple[list[tuple[Cell, str]], list[str]]:
  """([(cell, the directory that holds its run under an older id)], [why others were left])."""
  present = cell_ids(root)
  wanted = {c.run_id for c in cells}
  found, left = [], []
  for cell in cells:
    if cell.run_id in present:
      continue
    labels = cell.run_id.rsplit("-", 1)[0]
    for old in (d for d in present if d not in wanted and d.rsplit("-", 1)[0] == labels):
      saved = read_json(storage.join(root, old, "config.json"))
      differs = "never started (no config.json)" if saved is None else same_experiment(saved, cell)
      if differs is None and CellLock.held(storage.join(root, old, LOCK_FILE)):
        differs = "its runner still holds it"
      if differs is None:
        found.append((cell, old))
        break
      left.append(f"{old}: not {cell.run_id} ({differs if ' ' in differs else differs + ' differs'})")
  return found, left


def rekey(cells: list[Cell], root: str, dry_run: bool = False, say=print) -> int:
  """Renames each found directory to its cell's id (`moves`); the number moved."""
  found, left = moves(cells, root)
  for line in left:
    say(f"left {line}")
  for cell, old in found:
    say(f"{'would move' if dry_run else 'moved'} {old} -> {cell.run_id}")
    if dry_run:
      continue
    new = storage.join(root, cell.run_id)
    storage.rename(storage.join(root, old), new)
    write_json(storage.join(new, CELL_FILE), cell.to_json())
    if read_json(storage.join(new, STATUS_FILE)) is not None:
      update_status(new, run_id=cell.run_id, note=f"rekeyed from {old}")
  return len(found)
