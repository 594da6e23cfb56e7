"""Reading XLA's compiled HLO text in tests: computations, what they call, what each instruction
makes, and the large arrays a compiled loop materialises on every iteration."""

from __future__ import annotations

import re

import numpy as np


def computations(hlo: str):
  """{computation name: its instruction lines} of an HLO module's text, and the entry's name."""
  comps, name, entry = {}, None, None
  for line in hlo.splitlines():
    head = re.match(r"(ENTRY )?%(\S+) ", line)
    if head and line.rstrip().endswith("{"):
      name = head.group(2)
      comps[name] = []
      entry = name if head.group(1) else entry
    elif name and line.startswith("  "):
      comps[name].append(line.strip())
  return comps, entry


def called(lines, attrs=("calls", "body", "condition", "to_apply", "branch_computations")):
  """Names of the computations that instructions `lines` call through `attrs`."""
  out = set()
  for line in lines:
    for attr, one, many in re.findall(r"(\w+)=(?:%([\w.-]+)|\{([^}]*)\})", line):
      if attr in attrs:
        out |= {one} if one else {n.strip().lstrip("%") for n in many.split(",")}
  return out


def shape(dims) -> str:
  return "f32[" + ",".join(map(str, dims)) + "]"


def made(line):
  """(result type, opcode) of an instruction line, e.g. ('f32[2,2,16,17]', 'fusion')."""
  m = re.match(r"(?:ROOT )?%\S+ = (\w+\[[\d,]*\])\S* ([\w-]+)\(", line)
  return (m.group(1), m.group(2)) if m else (None, None)


def copies_outside_entry(hlo: str, shapes) -> list[str]:
  """Copy instructions of a type in `shapes` outside the entry computation (in loop bodies)."""
  comps, entry = computations(hlo)
  return [line[:100] for name, lines in comps.items() if name != entry for line in lines
          if made(line) in {(s, "copy") for s in shapes}]


def large_values_in_loops(hlo: str, min_elements: int) -> list[str]:
  """Result types of the f32 values of >= 4 dims and >= `min_elements` elements that the
  non-entry, non-fused computations (loop bodies) materialise: what a loop iteration writes."""
  comps, entry = computations(hlo)
  fused = set().union(*(called(lines, ("calls",)) for lines in comps.values()))
  big = []
  for name, lines in comps.items():
    if name == entry or name in fused:
      continue  # the entry runs once; a fused computation's values are not materialised
    for line in lines:
      kind, op = made(line)
      dims = [int(d) for d in kind[4:-1].split(",") if d] if kind and kind.startswith("f32[") else []
      if op not in (None, "parameter", "get-tuple-element") and len(dims) >= 4 and np.prod(dims) >= min_elements:
        big.append(kind)
  return big
