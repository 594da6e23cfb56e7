"""A planning grid's table and curves (docs/papers/nextlat.md#results).

  python -m nsl.evals.planning_study --root=ROOT [--limit=500] [--batch_size=250] [--unfinished]


Every done cell under a grid root (configs/grids/path_star_cpu.py, countdown_cpu.py) gets its
learning curve scored (`planning.evaluate_curve`: every kept checkpoint, incremental, so a rerun
scores only new checkpoints) and the cells are grouped by their grid labels other than the seed.
One row per group: the seeds, steps trained, final exact-match accuracy and (path-star) the
first decision after the start node, each as mean ± sd over the seeds (population sd, as
`nsl.evals.length_generalization` reports) with the per-seed values, and the Clever-Hans level
1/d beside them. Where GPT sits at 1/d with every later edge right, accuracy = first decision.

The plot has one column per task setting (the `size` label) and two rows against training
sequences seen (step × batch size, the axis of the papers' and third-party curves): first-decision accuracy (exact-match accuracy for countdown) and the training losses at
that step: CE for every arm, L_next-h for NextLat (the paper's latent regression, whose collapse
to ≈ 0 with CE stuck at ln V is the failure this study separates from planning). Each seed is
one line, in its group's colour. Writes ROOT/planning_study.{json,md,png}; with `--temperature`
> 0 the answers are sampled (`nsl.evals.planning`) and the files are ROOT/planning_study_T{T}.*.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from nsl.errors import ArgumentParser, NslError, cli_main
from nsl.evals import planning


def cell_curves(root: str, limit: int | None, batch_size: int, temperature: float = 0.0,
                sample_seed: int = 0, unfinished: bool = False) -> list[dict]:
  """[{run, group, size, arm, seed, curve}] for every done cell of `root` (with `unfinished`, every
  cell with a checkpoint), curves scored as needed."""
  from nsl.evals import common

  rows = []
  for run, group, seed in common.grid_runs(root, unfinished=unfinished):
    with open(os.path.join(run, "cell.json"), encoding="utf-8") as f:
      labels = json.load(f).get("labels", {})
    with open(os.path.join(run, "config.json"), encoding="utf-8") as f:
      batch = int(json.load(f)["train"]["batch_size"])
    curve = planning.evaluate_curve(run, limit, batch_size, temperature=temperature, sample_seed=sample_seed)
    rows.append({"run": run, "group": group, "seed": seed, "size": labels.get("size", ""),
                 "arm": "-".join(str(v) for k, v in labels.items() if k not in ("seed", "size")), "curve": curve,
                 "batch_size": batch})
  return rows


def _stats(values: list[float]) -> dict:
  a = np.asarray(values, dtype=float)
  return {"mean": float(a.mean()), "sd": float(a.std()), "per_seed": [float(v) for v in a]}


def group_rows(cells: list[dict]) -> list[dict]:
  """One row per group (labels but the seed), seeds sorted, stats of each cell's last point."""
  groups: dict[str, list[dict]] = {}
  for c in cells:
    groups.setdefault(c["group"], []).append(c)
  rows = []
  for group, members in groups.items():
    members = sorted(members, key=lambda c: c["seed"])
    last = [c["curve"]["points"][-1] for c in members]
    row = {"group": group, "size": members[0]["size"], "arm": members[0]["arm"],
           "seeds": [c["seed"] for c in members], "steps": [p["step"] for p in last],
           "accuracy": _stats([p["accuracy"] for p in last])}
    if all("first_step_acc" in p for p in last):
      row["first_step_acc"] = _stats([p["first_step_acc"] for p in last])
      row["chance_first_step"] = members[0]["curve"]["chance_first_step"]
    rows.append(row)
  return rows


def _pm(s: dict) -> str:
  per_seed = ", ".join(f"{100 * v:.1f}" for v in s["per_seed"])
  return f"{100 * s['mean']:.1f} ± {100 * s['sd']:.1f}% ({per_seed})"


def table(rows: list[dict]) -> str:
  """Markdown: group, seeds, steps, accuracy and first decision (mean ± sd, per seed), chance."""
  first = any("first_step_acc" in r for r in rows)
  head = ["group", "seeds", "steps", "exact match"] + (["first decision", "1/d"] if first else [])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [f"`{r['group']}`", str(len(r["seeds"])), ", ".join(map(str, sorted(set(r["steps"])))), _pm(r["accuracy"])]
    if first:
      cells += [_pm(r["first_step_acc"]), f"{r['chance_first_step']:.2f}"] if "first_step_acc" in r else ["–", "–"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(cells: list[dict], path: str) -> None:
  from nsl import plots

  plt = plots.pyplot()

  sizes = sorted({c["size"] for c in cells})
  arms = sorted({c["arm"] for c in cells})
  colours = {a: f"C{i}" for i, a in enumerate(arms)}
  fig, axes = plt.subplots(2, len(sizes), figsize=(5 * len(sizes), 7), squeeze=False, sharex="col")
  for j, size in enumerate(sizes):
    top, bottom = axes[0][j], axes[1][j]
    for arm in arms:
      members = [c for c in cells if c["size"] == size and c["arm"] == arm]
      for k, c in enumerate(members):
        pts = c["curve"]["points"]
        seen = [p["step"] * c["batch_size"] for p in pts]  # the papers' axis: training sequences seen
        key = "first_step_acc" if "first_step_acc" in pts[0] else "accuracy"
        label = f"{arm} ({len(members)} seed{'s' * (len(members) > 1)})" if k == 0 else None
        top.plot(seen, [p[key] for p in pts], color=colours[arm], lw=0.8, alpha=0.6, marker="o", ms=2, label=label)
        ce = [(p["step"] * c["batch_size"], p["train"]["ce"]) for p in pts if "ce" in p.get("train", {})]
        nh = [(p["step"] * c["batch_size"], p["train"]["next_h"]) for p in pts if "next_h" in p.get("train", {})]
        if ce:
          bottom.plot(*zip(*ce), color=colours[arm], lw=1.0, label=f"{arm} CE" if k == 0 else None)
        if nh:
          bottom.plot(*zip(*nh), color=colours[arm], lw=1.0, ls="--", label=f"{arm} L_next-h" if k == 0 else None)
    chance = next((c["curve"].get("chance_first_step") for c in cells if c["size"] == size), None)
    if chance:
      top.axhline(chance, color="gray", ls=":", label=f"Clever Hans 1/d = {chance:.2f}")
    top.set_title(size)
    top.set_ylabel("first-decision accuracy" if chance else "exact-match accuracy")
    top.set_ylim(-0.02, 1.02)
    bottom.set_yscale("log")
    bottom.set_ylabel("training loss at the checkpoint")
    bottom.set_xlabel("training sequences seen (steps × batch)")
    top.legend(fontsize=7)
    bottom.legend(fontsize=7)
  plots.save(fig, path, dpi=110)


def study(root: str, limit: int | None = None, batch_size: int = 250, temperature: float = 0.0,
          sample_seed: int = 0, unfinished: bool = False) -> dict:
  """Score, group, tabulate and plot every done cell of a planning grid root (with `unfinished`,
  the cells still training too, up to their latest checkpoint: the table's steps say where)."""
  if not os.path.isdir(root):
    raise NslError(f"--root={root}: not a directory")
  cells = cell_curves(root, limit, batch_size, temperature, sample_seed, unfinished)
  rows = group_rows(cells)
  result = {"root": root, "limit": limit, "temperature": temperature, "groups": rows, "table": table(rows),
            "cells": [{k: c[k] for k in ("run", "group", "seed")} for c in cells]}
  stem = os.path.join(root, "planning_study" + planning.file_suffix(temperature))
  with open(stem + ".json", "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  with open(stem + ".md", "w", encoding="utf-8") as f:
    f.write(result["table"] + "\n")
  plot(cells, stem + ".png")
  return result


@cli_main
def main(argv=None) -> int:
  p = ArgumentParser(prog="python -m nsl.evals.planning_study", description=__doc__.split("\n")[0])
  p.add_argument("--root", required=True, help="a planning grid root (nsl.scaling.grid)")
  p.add_argument("--limit", type=int, default=None, help="first N test problems only")
  p.add_argument("--batch_size", type=int, default=250, help="test problems per decoding batch")
  p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled answers")
  p.add_argument("--sample_seed", type=int, default=0, help="the sampling key's seed (with --temperature > 0)")
  p.add_argument("--unfinished", action="store_true",
                 help="also score cells still training (up to their latest checkpoint)")
  a = p.parse_args(argv)
  print(study(a.root, a.limit, a.batch_size, a.temperature, a.sample_seed, a.unfinished)["table"])
  return 0


if __name__ == "__main__":
  sys.exit(main())
