"""A grid cell on disk: its definition and the files of its directory (docs/papers/scaling_laws.md#practice).

Every cell of a grid owns ROOT/<run_id>/ with
  cell.json    the `Cell` (base config, overrides, labels, size, steps, tokens);
  status.json  pending / running / done / failed, attempts, failures, times, the command;
  .runner.lock the owning runner's process (`nsl.scaling.locks.CellLock`) while one runs it;
  launch.log   the launcher's output; and the run's own record files (result.json, ...).
This module reads and writes them for the grid CLI (`nsl.scaling.grid`) and the runner
(`nsl.scaling.runner`); their formats are those every earlier grid root was written in.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from nsl.errors import NslError
from nsl.scaling.locks import CellLock

CELL_FILE, STATUS_FILE, LOCK_FILE, LOG_FILE = "cell.json", "status.json", ".runner.lock", "launch.log"
CELL_REF = "@cell:"  # a config value naming another cell of the root (`nsl.scaling.grid`)


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of a grid: a config file plus overrides in launcher (`--config.a.b=v`) form."""

  run_id: str
  config_path: str  # absolute
  overrides: tuple[tuple[str, str], ...]  # (field, CLI string), in application order
  labels: tuple[tuple[str, str], ...]  # (axis, label)
  config_hash: str
  family: str
  variant: str
  size: str
  steps: int
  tokens: int  # steps x batch_size x seq_len: what the run will actually train on
  requires: tuple[str, ...] = ()  # run ids of the same root this cell's config names ("@cell:<id>")

  def launch_args(self, workdir: str) -> list[str]:
    """Arguments after `python -m nsl.launch`; an "@cell:<run id>" value becomes that cell's
    directory, the sibling of `workdir` under the grid's root."""
    root = os.path.dirname(workdir.rstrip("/"))
    value = lambda v: os.path.join(root, v[len(CELL_REF):]) if v.startswith(CELL_REF) else v
    return [f"--config={self.config_path}", f"--workdir={workdir}",
            *(f"--config.{k}={value(v)}" for k, v in self.overrides)]

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["overrides"], d["labels"] = dict(self.overrides), dict(self.labels)
    d["requires"] = list(self.requires)
    return d


# -- cell files -----------------------------------------------------------------------------------
def read_json(path: Path) -> dict | None:
  """The JSON object in `path`, or None when it is missing, partly written or not an object."""
  try:
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else None
  except (OSError, ValueError):
    return None


def write_json(path: Path, obj: dict) -> None:
  """Writes `obj` atomically (a reader never sees half a status file)."""
  from nsl import metrics
  metrics.write_json(str(path), obj)


def stamp() -> str:
  """Local time as the cell files record it (2026-01-31T12:00:00)."""
  return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())


def result_status(cell_dir: Path) -> str | None:
  """The run's own verdict (result.json `status`: done / failed / preempted), None before one."""
  result = read_json(cell_dir / "result.json")
  return result.get("status") if result else None


def update_status(cell_dir: Path, **fields) -> dict:
  status = read_json(cell_dir / STATUS_FILE) or {}
  status.update(fields, updated=stamp())
  write_json(cell_dir / STATUS_FILE, status)
  return status


def log_tail(cell_dir: Path, lines: int = 5) -> str:
  """The last `lines` non-empty lines of the cell's launch.log, joined by " | " (for status.json)."""
  try:
    with open(cell_dir / LOG_FILE, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 4000))
      text = f.read().decode("utf-8", "replace")
  except OSError:
    return ""
  return " | ".join([l.strip() for l in text.replace("\r", "\n").splitlines() if l.strip()][-lines:])


# -- status ---------------------------------------------------------------------------------------
def cell_rows(root: Path, run_ids: list[str] | None = None) -> list[dict]:
  """One row per cell directory (all of ROOT when run_ids is None)."""
  if not root.is_dir():
    raise NslError(f"--root={root}: not a directory")
  if run_ids is None:  # the last grid's order (grid.json), then any other cells by name
    listed = (read_json(root / "grid.json") or {}).get("cells", [])
    present = sorted(p.name for p in root.iterdir() if (p / CELL_FILE).is_file())
    run_ids = [r for r in listed if r in present] + [r for r in present if r not in listed]
  rows = []
  for run_id in run_ids:
    d = root / run_id
    cell, status = read_json(d / CELL_FILE) or {}, read_json(d / STATUS_FILE) or {}
    result = read_json(d / "result.json") or {}
    state = status.get("status", "pending")
    if result.get("status") == "done":
      state = "done"
    elif state == "running" and not CellLock.held(d / LOCK_FILE):
      state = "stale"  # its runner died: the next `run` resumes it
    val = (result.get("eval") or {}).get("val") if isinstance(result.get("eval"), dict) else None
    family = cell.get("family", "?")
    variant = cell.get("variant")
    rows.append({"run_id": run_id, "family": family if variant in (None, family) else f"{family}/{variant}",
                 "size": cell.get("size", "?"), "params": result.get("params_total"),
                 "tokens": cell.get("tokens"), "status": state, "attempts": status.get("attempts", 0),
                 "val_loss": val})
  return rows


def summarize(root: Path, run_ids: list[str]) -> dict[str, int]:
  counts: dict[str, int] = {}
  for row in cell_rows(root, run_ids):
    counts[row["status"]] = counts.get(row["status"], 0) + 1
  return counts
