"""Run records: the only input of the scaling analysis (docs/reference/records.md).

A grid root holds one directory per run, `ROOT/<run_id>/` or one level deeper
`ROOT/<group>/<run_id>/`; a run directory is one that holds `result.json` (and normally
`config.json`). Only runs whose `status` is "done" are analysed (docs/papers/scaling_laws.md#practice, Marin:
"analysis reads only finished records"); the others are counted by status so a report can say
what it left out.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from nsl.errors import NslError

# Fields every finished result.json must carry for the fits and plots.
REQUIRED_FIELDS = ("family", "params_total", "params_embedding", "params_non_embedding", "tokens",
                   "flops", "flops_per_token", "eval")
DONE = "done"


def family_label(family: str, variant: str | None) -> str:
  """The label a run is fitted under: the variant when it names one other than the family.

  SPS variants (e.g. "sps_delayed") are thereby separate families for the fits.
  """
  return variant if variant and variant != family else family


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """One finished run as the analysis sees it. Counts are floats (they reach 1e12 and beyond)."""

  run_id: str
  path: Path
  family: str
  variant: str | None
  params_total: float
  params_embedding: float
  params_non_embedding: float
  tokens: float
  flops: float
  flops_per_token: float
  eval: dict[str, float]
  final_loss: float | None
  seed: int | None
  window: int | None  # config `model.window` (None = absent or full attention)
  # eval splits in bits per byte and the validation bytes per token they came from
  # (nsl.data.bytes_per_token); empty/None for runs recorded before they were stored
  bits_per_byte: dict[str, float] = dataclasses.field(default_factory=dict)
  bytes_per_token: float | None = None

  @property
  def label(self) -> str:
    return family_label(self.family, self.variant)

  def loss(self, key: str = "val") -> float:
    """The mean NLL per token of eval split `key`; NslError naming the file if it is absent."""
    if key not in self.eval:
      raise NslError(f"{self.path / 'result.json'}: eval has no split {key!r} (has "
                     f"{sorted(self.eval)}); pass --loss_key=<one of them>")
    return float(self.eval[key])


@dataclasses.dataclass
class RunSet:
  """The finished runs of a root, and what was left out (status or reason -> count)."""

  root: Path
  runs: list[RunRecord]
  skipped: dict[str, int]

  def by_label(self) -> dict[str, list[RunRecord]]:
    groups: dict[str, list[RunRecord]] = collections.defaultdict(list)
    for r in self.runs:
      groups[r.label].append(r)
    return dict(sorted(groups.items()))


def _read_json(path: Path) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise NslError(f"{path}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
  except OSError as e:
    raise NslError(f"{path}: cannot read: {e.strerror}") from None


def find_run_dirs(root: Path) -> tuple[list[Path], int]:
  """Run directories under `root` (depth 1 or 2), and the count of depth-1 directories that
  look like runs (they hold config.json) but have no result.json yet."""
  runs, no_result = [], 0
  for child in sorted(p for p in root.iterdir() if p.is_dir()):
    if (child / "result.json").is_file():
      runs.append(child)
      continue
    nested = sorted(p for p in child.iterdir() if p.is_dir() and (p / "result.json").is_file())
    runs.extend(nested)
    if not nested and (child / "config.json").is_file():
      no_result += 1
  return runs, no_result


def _number(result: dict, field: str, path: Path) -> float:
  v = result[field]
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
    raise NslError(f"{path}: field {field!r} must be a non-negative finite number, got {v!r}")
  return float(v)


def _optional_number(result: dict, field: str) -> float | None:
  v = result.get(field)
  return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _record(root: Path, run_dir: Path, result: dict, config: dict) -> RunRecord:
  path = run_dir / "result.json"
  missing = [f for f in REQUIRED_FIELDS if f not in result]
  if missing:
    raise NslError(f"{path}: finished run lacks field(s) {missing}")
  evals = result["eval"]
  if not isinstance(evals, dict) or not all(isinstance(v, (int, float)) for v in evals.values()):
    raise NslError(f"{path}: 'eval' must map split names to numbers, got {evals!r}")
  model_cfg = config.get("model") if isinstance(config.get("model"), dict) else {}
  variant = result.get("variant", model_cfg.get("variant"))
  window = model_cfg.get("window")
  final_loss = result.get("final_loss")
  return RunRecord(
      run_id=run_dir.relative_to(root).as_posix(),
      path=run_dir,
      family=str(result["family"]),
      variant=None if variant is None else str(variant),
      params_total=_number(result, "params_total", path),
      params_embedding=_number(result, "params_embedding", path),
      params_non_embedding=_number(result, "params_non_embedding", path),
      tokens=_number(result, "tokens", path),
      flops=_number(result, "flops", path),
      flops_per_token=_number(result, "flops_per_token", path),
      eval={str(k): float(v) for k, v in evals.items()},
      final_loss=None if final_loss is None else float(final_loss),
      seed=config.get("seed"),
      window=window if isinstance(window, int) and not isinstance(window, bool) else None,
      bits_per_byte={str(k): float(v) for k, v in (result.get("eval_bits_per_byte") or {}).items()
                     if isinstance(v, (int, float))},
      bytes_per_token=_optional_number(result, "val_bytes_per_token"),
  )


def load_runs(root: str | Path, loss_key: str = "val") -> RunSet:
  """Loads the finished runs of a grid root.

  Non-finished runs are counted by status; finished runs whose `eval[loss_key]` is not a finite
  number (a diverged run) are counted as "non-finite loss" rather than fitted. Malformed JSON
  or a finished run missing a required field raises NslError naming the file.
  """
  root = Path(root)
  if not root.is_dir():
    raise NslError(f"--root={root}: not a directory")
  dirs, no_result = find_run_dirs(root)
  skipped: collections.Counter[str] = collections.Counter()
  if no_result:
    skipped["no result.json"] = no_result
  runs = []
  for run_dir in dirs:
    result = _read_json(run_dir / "result.json")
    if not isinstance(result, dict):
      raise NslError(f"{run_dir / 'result.json'}: expected a JSON object")
    status = result.get("status")
    if status != DONE:
      skipped[f"status {status}"] += 1
      continue
    config = _read_json(run_dir / "config.json") if (run_dir / "config.json").is_file() else {}
    record = _record(root, run_dir, result, config if isinstance(config, dict) else {})
    if not math.isfinite(record.loss(loss_key)):
      skipped["non-finite loss"] += 1
      continue
    runs.append(record)
  return RunSet(root=root, runs=runs, skipped=dict(sorted(skipped.items())))
