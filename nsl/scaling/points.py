"""What the fits read: (N, D, loss, C, family) points from a grid root or a table, and the
`--exclude` rules that drop some of them (docs/guide/scaling.md, "Inputs").

A grid root gives one point per finished run (`records.load_runs`): N = total (or non-embedding)
parameters, D = tokens, loss = eval[loss_key] in nats per token, C = the run's stored training
FLOPs (FLOPs per token x tokens, the convention in result.json). A table is a .csv file with a
header row or a .jsonl file of objects, with columns N, D, loss and optionally family and C; a
table without C gets C = 6ND, and the report says so.

An exclusion rule is `FIELD OP VALUE`: FIELD one of N, D, C, loss, D/N (tokens per parameter),
family; OP one of < <= > >= == !=; VALUE a number (1e5, 3000) or, for family, a name. A point
matching any rule is left out: `--exclude 'D<1e5' --exclude 'family==sps'`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import operator
import re
from pathlib import Path

from nsl.errors import NslError
from nsl.scaling.records import load_runs

PARAM_KEYS = {"total": "params_total", "non_embedding": "params_non_embedding"}
TABLE_FIELDS = ("N", "D", "loss", "family", "C")
DEFAULT_FAMILY = "all"
OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
       "<": operator.lt, ">": operator.gt}
RULE_RE = re.compile(r"^\s*(N|D|C|loss|D/N|family)\s*(<=|>=|==|!=|<|>)\s*(\S(?:.*\S)?)\s*$")


@dataclasses.dataclass(frozen=True)
class Point:
  id: str
  family: str
  N: float
  D: float
  loss: float
  C: float
  window: int | None = None  # config model.window of a run (None: full attention or a table)

  def field(self, name: str):
    return self.D / self.N if name == "D/N" else getattr(self, name)


@dataclasses.dataclass
class PointSet:
  source: str
  kind: str  # "grid" or "table"
  points: list[Point]
  compute: str  # "stored training FLOPs" or "6ND (...)"
  skipped: dict[str, int]  # runs left out before any rule, by reason
  excluded: dict[str, int] = dataclasses.field(default_factory=dict)  # rule -> points it dropped

  def by_family(self) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {}
    for p in self.points:
      out.setdefault(p.family, []).append(p)
    return dict(sorted(out.items()))


@dataclasses.dataclass(frozen=True)
class Rule:
  text: str
  field: str
  op: str
  value: float | str

  def matches(self, p: Point) -> bool:
    return OPS[self.op](p.field(self.field), self.value)


def parse_rule(text: str) -> Rule:
  """`FIELD OP VALUE` (module docstring) -> Rule; NslError naming the rule otherwise."""
  m = RULE_RE.match(text)
  if not m:
    raise NslError(f"--exclude={text!r}: expected FIELD OP VALUE with FIELD in N, D, C, loss, D/N, "
                   "family and OP in < <= > >= == != (e.g. --exclude 'D<1e5')")
  field, op, raw = m.groups()
  if field == "family":
    if op not in ("==", "!="):
      raise NslError(f"--exclude={text!r}: family compares only with == or !=")
    return Rule(text, field, op, raw)
  try:
    value = float(raw)
  except ValueError:
    raise NslError(f"--exclude={text!r}: {raw!r} is not a number") from None
  return Rule(text, field, op, value)


def apply_rules(ps: PointSet, rules: list[Rule]) -> PointSet:
  keep, excluded = [], {r.text: 0 for r in rules}
  for p in ps.points:
    hit = next((r for r in rules if r.matches(p)), None)
    if hit is None:
      keep.append(p)
    else:
      excluded[hit.text] += 1
  return dataclasses.replace(ps, points=keep, excluded=excluded)


def _from_grid(root: Path, loss_key: str, params: str) -> PointSet:
  runset = load_runs(root, loss_key)
  key = PARAM_KEYS[params]
  points = [Point(r.run_id, r.label, getattr(r, key), r.tokens, r.loss(loss_key), r.flops, r.window)
            for r in runset.runs]
  bad = [r.run_id for r in runset.runs if not (getattr(r, key) > 0 and r.tokens > 0 and r.flops > 0)]
  if bad:
    raise NslError(f"{root / bad[0]}/result.json: N, tokens and flops must be positive to be fitted")
  return PointSet(str(root), "grid", points, "stored training FLOPs", runset.skipped)


def _table_rows(path: Path) -> list[tuple[int, dict]]:
  try:
    text = path.read_text(encoding="utf-8")
  except OSError as e:
    raise NslError(f"{path}: cannot read: {e.strerror}") from None
  if path.suffix == ".jsonl":
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise NslError(f"{path}:{i}: not a JSON object ({e.msg})") from None
      if not isinstance(row, dict):
        raise NslError(f"{path}:{i}: expected a JSON object with N, D, loss")
      rows.append((i, row))
    return rows
  reader = csv.DictReader(text.splitlines())
  return [(i, row) for i, row in enumerate(reader, 2)]


def _positive(path: Path, line: int, row: dict, name: str) -> float:
  raw = row.get(name)
  try:
    v = float(raw)
  except (TypeError, ValueError):
    v = math.nan
  if not (math.isfinite(v) and v > 0):
    raise NslError(f"{path}:{line}: {name}={raw!r} is not a positive finite number")
  return v


def _from_table(path: Path) -> PointSet:
  if path.suffix not in (".csv", ".jsonl"):
    raise NslError(f"{path}: a table must be a .csv (with a header row) or .jsonl file; "
                   "or pass a grid root directory")
  rows = _table_rows(path)
  if not rows:
    raise NslError(f"{path}: no rows; a table needs columns N, D, loss (optional: family, C)")
  columns = set().union(*(r.keys() for _, r in rows))
  missing = [f for f in ("N", "D", "loss") if f not in columns]
  if missing:
    raise NslError(f"{path}: no column {', '.join(missing)} (has {', '.join(sorted(map(str, columns)))}); "
                   "a table needs columns N, D, loss (optional: family, C)")
  has_c = "C" in columns
  points = []
  for line, row in rows:
    N, D = _positive(path, line, row, "N"), _positive(path, line, row, "D")
    loss = _positive(path, line, row, "loss")
    C = _positive(path, line, row, "C") if has_c else 6.0 * N * D
    family = str(row.get("family") or DEFAULT_FAMILY)
    points.append(Point(f"{path.name}:{line}", family, N, D, loss, C))
  compute = "stored training FLOPs (column C)" if has_c else "6ND (the table has no C column)"
  return PointSet(str(path), "table", points, compute, {})


def load_points(source: str | Path, *, loss_key: str = "val", params: str = "total",
                exclude: list[str] = ()) -> PointSet:
  """Points of a grid root (a directory) or a table (.csv/.jsonl), minus the excluded ones."""
  if params not in PARAM_KEYS:
    raise NslError(f"--params={params}: must be one of {sorted(PARAM_KEYS)}")
  rules = [parse_rule(r) for r in exclude]
  path = Path(source)
  if path.is_dir():
    ps = _from_grid(path, loss_key, params)
  elif path.is_file():
    ps = _from_table(path)
  else:
    raise NslError(f"{source}: no such grid root or table; pass a directory of runs or a .csv/.jsonl file")
  ps = apply_rules(ps, rules)
  if not ps.points:
    what = "finished runs (status 'done')" if ps.kind == "grid" else "rows"
    left = f"; left out: {ps.skipped}" if ps.skipped else ""
    rules_note = f"; excluded by rule: {ps.excluded}" if any(ps.excluded.values()) else ""
    raise NslError(f"{source}: no {what} to fit{left or (' (nothing found)' if not rules_note else '')}{rules_note}")
  return ps
