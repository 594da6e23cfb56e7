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
import hashlib
import json
import os
import time

from nsl import storage
from nsl.errors import NslError
from nsl.scaling.locks import CellLock

CELL_FILE, STATUS_FILE, LOCK_FILE, LOG_FILE = "cell.json", "status.json", ".runner.lock", "launch.log"
CELL_REF = "@cell:"  # a config value naming another cell of the root (`nsl.scaling.grid`)


@dataclasses.dataclass(frozen=True)
class Cell:
  """One run of a grid: a config file plus overrides in launcher (`--config.a.b=v`) form."""

  run_id: str
  config_path: str  # FILE.py[:ARG], relative to the code root when the file is in it (else absolute)
  overrides: tuple[tuple[str, str], ...]  # (field, CLI string), in application order
  labels: tuple[tuple[str, str], ...]  # (axis, label)
  config_hash: str
  family: str
  variant: str
  size: str
  steps: int
  tokens: int  # steps x batch_size x seq_len: what the run will actually train on
  requires: tuple[str, ...] = ()  # run ids of the same root this cell's config names ("@cell:<id>")
  hosts: int = 1  # processes, one per host (node): where the cell runs, not what it trains
  slice: str = ""  # the slice type (v5p-8) or node group it runs on; "" = the backend's default

  def launch_args(self, workdir: str, placed: dict[str, str] | None = None) -> list[str]:
    """Arguments after `python -m nsl.launch` (run from the code root); an "@cell:<run id>" value
    becomes that cell's directory, the sibling of `workdir` under the grid's root. `placed`: fields
    the runner sets for where things are (the grid's prepared data), outside the cell's identity."""
    root = storage.dirname(workdir)
    value = lambda v: storage.join(root, v[len(CELL_REF):]) if v.startswith(CELL_REF) else v
    return [f"--config={self.config_path}", f"--workdir={workdir}",
            *(f"--config.{k}={value(v)}" for k, v in self.overrides),
            *(f"--config.{k}={v}" for k, v in (placed or {}).items())]

  @classmethod
  def from_json(cls, d: dict) -> "Cell":
    fields = {f.name for f in dataclasses.fields(cls)}
    d = {k: v for k, v in d.items() if k in fields}
    return cls(**{**d, "overrides": tuple(d.get("overrides", {}).items()), "labels": tuple(d.get("labels", {}).items()),
                  "requires": tuple(d.get("requires", ()))})

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["overrides"], d["labels"] = dict(self.overrides), dict(self.labels)
    d["requires"] = list(self.requires)
    return d


# -- identity -------------------------------------------------------------------------------------
# Fields added after grids were run, at the value that trains a cell as it was trained before the
# field existed: left out of the hash so those cells keep their ids (an empty value is "unset").
NEUTRAL_FIELDS = {("init_seed",): None, ("evals",): {}, ("model", "cpu_kernels"): True, ("data", "mixture"): "",
                  ("data", "answer_token"): -1}
# The trunk options (nsl.nn.layers.Dims) the base config gained when it was built from the schemas
# (nsl.options): configs that never set them kept their defaults.
NEUTRAL_FIELDS.update({("model", name): value for name, value in (
    ("mup_base_width", 0), ("tie_embeddings", True), ("scaled_out_init", True), ("scaled_mlp_out_init", True),
    ("mup_base_head_dim", 64), ("mup_readout", "sqrt"), ("mlp", "swiglu"), ("final_norm", "rmsnorm"),
    ("init", "normal"), ("document_mask", True))})
MUP_OPTIONS = ("model.mup_base_head_dim", "model.mup_readout")
# Fields that never change what a cell trains or records: always left out (turning W&B on or
# tracing a few steps finds the grid's finished cells).
IGNORED_FIELDS = (("log",), ("train", "profile_steps"), ("checkpoint", "every_minutes"))


def config_hash(config_dict: dict) -> str:
  """The run id's digest: the config in the layout grids were first keyed by (`nsl.options.legacy_layout`),
  less NEUTRAL_FIELDS at their neutral value and IGNORED_FIELDS."""
  def drop(d: dict, path: tuple[str, ...], keep=lambda v: False) -> dict:
    head, *rest = path
    if head not in d:
      return d
    if rest:
      return {**d, head: drop(d[head], tuple(rest), keep)} if isinstance(d[head], dict) else d
    return d if keep(d[head]) else {k: v for k, v in d.items() if k != head}

  from nsl import options

  kept = options.legacy_kept(config_dict)
  config_dict = options.legacy_layout(config_dict)
  if (config_dict.get("model") or {}).get("mup_base_width"):
    kept += MUP_OPTIONS  # configs that turned μP on set its options too
  for path, neutral in NEUTRAL_FIELDS.items():
    if ".".join(path) in kept:
      continue
    config_dict = drop(config_dict, path, keep=lambda v, n=neutral: v != n and not (n in ({}, "") and not v))
  for path in IGNORED_FIELDS:
    config_dict = drop(config_dict, path)
  blob = json.dumps(config_dict, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(blob.encode()).hexdigest()[:10]


def human(x: float) -> str:
  """20e9 -> '20B', 1.5e6 -> '1.5M'."""
  for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
    if abs(x) >= div:
      return f"{x / div:.3g}{suffix}"
  return f"{x:.3g}"


# -- cell files -----------------------------------------------------------------------------------
def read_json(path: str) -> dict | None:
  """The JSON object at `path` (a file or an object), or None when it is missing, partly written
  or not an object."""
  try:
    data = json.loads(storage.read_text(str(path)))
    return data if isinstance(data, dict) else None
  except (OSError, ValueError):
    return None


def write_json(path: str, obj: dict) -> None:
  """Writes `obj` whole (a reader never sees half a status file)."""
  from nsl import metrics
  metrics.write_json(str(path), obj)


def stamp() -> str:
  """Local time as the cell files record it (2026-01-31T12:00:00)."""
  return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())


def result_status(cell_dir: str) -> str | None:
  """The run's own verdict (result.json `status`: done / failed / preempted), None before one."""
  result = read_json(storage.join(str(cell_dir), "result.json"))
  return result.get("status") if result else None


def update_status(cell_dir: str, **fields) -> dict:
  path = storage.join(str(cell_dir), STATUS_FILE)
  status = read_json(path) or {}
  status.update(fields, updated=stamp())
  write_json(path, status)
  return status


def _tail_text(path: str, limit: int = 4000) -> str:
  if storage.is_remote(path):
    return storage.read_text(path)[-limit:]
  with open(path, "rb") as f:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - limit))
    return f.read().decode("utf-8", "replace")


def log_tail(cell_dir: str, lines: int = 5) -> str:
  """The last `lines` non-empty lines of the cell's worker logs (logs/NAME.log, or the older
  launch.log), joined by " | " and prefixed "[NAME]" (for status.json): the first log holding an
  error line, else the last written."""
  cell_dir = str(cell_dir)
  logs = storage.join(cell_dir, "logs")
  try:
    paths = [storage.join(logs, n) for n in storage.listdir(logs) if n.endswith(".log")] if storage.isdir(logs) else []
  except OSError:
    paths = []
  paths += [storage.join(cell_dir, LOG_FILE)] if storage.isfile(storage.join(cell_dir, LOG_FILE)) else []
  tails = []
  for path in paths:
    try:
      text = _tail_text(path)
    except OSError:
      continue
    kept = [l.strip() for l in text.replace("\r", "\n").splitlines() if l.strip()][-lines:]
    if kept:
      tails.append((storage.basename(path).rsplit(".", 1)[0], kept))
  if not tails:
    return ""
  failing = [t for t in tails if any(("error" in l.lower() or "Traceback" in l) for l in t[1])]
  name, kept = (failing or tails)[0] if failing else tails[-1]
  prefix = f"[{name}] " if name != "launch" else ""
  return prefix + " | ".join(kept)


def progress(cell_dir: str, steps: int) -> dict:
  """A running cell's last logged step and loss from its metrics.jsonl (in a bucket: as of its
  last checkpoint, when the records go up), and the time left to `steps` at its last logged
  throughput: {} before any line."""
  try:
    text = _tail_text(storage.join(str(cell_dir), "metrics.jsonl"), 20000)
  except OSError:
    return {}
  rows = []
  for line in text.splitlines():
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if isinstance(row, dict) and "step" in row and "loss" in row:
      rows.append(row)
  if not rows:
    return {}
  last = rows[-1]
  out = {"step": int(last["step"]), "loss": float(last["loss"])}
  rate, tokens = last.get("tokens_per_sec"), last.get("tokens")
  if isinstance(rate, (int, float)) and rate > 0 and isinstance(tokens, (int, float)) and out["step"] > 0:
    out["eta_s"] = max(steps - out["step"], 0) * (tokens / out["step"]) / rate
  return out


# -- status ---------------------------------------------------------------------------------------
def cell_ids(root: str) -> list[str]:
  """The cells under ROOT: the last grid's order (grid.json), then any others by name."""
  if not storage.isdir(root):
    raise NslError(f"--root={root}: no grid there (not a directory, or an empty prefix)")
  listed = (read_json(storage.join(root, "grid.json")) or {}).get("cells", [])
  present = sorted(n for n in storage.listdir(root)
                   if not n.startswith(".") and storage.isfile(storage.join(root, n, CELL_FILE)))
  return [r for r in listed if r in present] + [r for r in present if r not in listed]


def cell_rows(root: str, run_ids: list[str] | None = None, live: bool = False) -> list[dict]:
  """One row per cell directory (all of ROOT when run_ids is None); `live`: a running cell's
  step, loss and time left (`progress`) and a failed one's error tail."""
  root = storage.resolve(str(root))
  rows = []
  for run_id in cell_ids(root) if run_ids is None else run_ids:
    d = storage.join(root, run_id)
    cell, status = read_json(storage.join(d, CELL_FILE)) or {}, read_json(storage.join(d, STATUS_FILE)) or {}
    result = read_json(storage.join(d, "result.json")) or {}
    state = status.get("status", "pending")
    if result.get("status") == "done":
      state = "done"
    elif state == "running" and not CellLock.held(storage.join(d, LOCK_FILE)):
      state = "stale"  # its runner died: the next `run` resumes it
    val = (result.get("eval") or {}).get("val") if isinstance(result.get("eval"), dict) else None
    family = cell.get("family", "?")
    variant = cell.get("variant")
    row = {"run_id": run_id, "family": family if variant in (None, family) else f"{family}/{variant}",
           "size": cell.get("size", "?"), "params": result.get("params_total"),
           "tokens": cell.get("tokens"), "status": state, "attempts": status.get("attempts", 0),
           "val_loss": val}
    if live and state == "running":
      row.update(progress(d, int(cell.get("steps") or 0)))
      if status.get("note"):  # a held job (nsl.scaling.runner._note)
        row["note"] = status["note"]
    if live and state == "failed":
      row["error"] = status.get("error") or log_tail(d)
    rows.append(row)
  return rows


def summarize(root: str, run_ids: list[str]) -> dict[str, int]:
  counts: dict[str, int] = {}
  for row in cell_rows(root, run_ids):
    counts[row["status"]] = counts.get(row["status"], 0) + 1
  return counts
