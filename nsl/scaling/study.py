"""`python -m nsl.scaling.study --root=DIR`: a seeded grid study as a table and a plot.

A study is a grid (`nsl.scaling.grid`) with a `seed` axis: every other axis label names an *arm*
of the study, and the seeds are its repeats. For each arm this reports the final validation NLL
(mean ± sample standard deviation over seeds) and, against a baseline arm (`--baseline=AXIS=LABEL`,
matched on every other label and paired by seed), the gap Δ = NLL(arm) − NLL(baseline) at every
periodic evaluation, so the gap can be read against tokens:

- **catches at**: the first evaluation where the mean paired gap is ≤ 0 after being > 0;
- otherwise **trend**: a line fitted to the mean gap against log(tokens) over the second half of
  the evaluations, extrapolated to Δ = 0 when it is closing (slope < 0), else "not closing".
  A log-linear trend is our reading, not the papers': it says only where the curves would meet
  if the late trend held.

Beside the NLL, each arm's validation bits per byte (mean ± sd, and its paired gap) and the bytes
per token they were converted with, with the validation bytes counted (result.json's
`eval_bits_per_byte`, `val_bytes_per_token`, `val_byte_counts`; `nsl.data.bytes_per_token`), so
arms with different tokenizers compare; "—" for runs recorded before those fields.

Only cells whose status is done are used; the others are counted. Prints a Markdown table;
`--json` writes the numbers, `--plot` the curves (NLL and gap against tokens, one panel per value
of `--panel`, seeds as a min–max band around their mean).
"""

from __future__ import annotations

import collections
import json
import math
import os
import statistics
from pathlib import Path

from nsl.errors import ArgumentParser, DataError, cli_main

SEED_AXIS = "seed"


def _read(path: Path):
  with open(path) as f:
    return json.load(f)


def load_cells(root: str) -> tuple[list[dict], collections.Counter]:
  """Done cells of a grid root: labels, the seed label, eval curve [(tokens, nll)], final NLL."""
  rootp = Path(root)
  if not rootp.is_dir():
    raise DataError(f"--root={root} is not a directory; pass a grid root (python -m nsl.scaling.grid run --root=...)")
  cells, skipped = [], collections.Counter()
  for cell_file in sorted(rootp.glob("*/cell.json")):
    d = cell_file.parent
    status = _read(d / "status.json").get("status", "pending") if (d / "status.json").exists() else "pending"
    if status != "done" or not (d / "result.json").exists():
      skipped[status] += 1
      continue
    cell, result, config = _read(cell_file), _read(d / "result.json"), _read(d / "config.json")
    tokens_per_step = int(config["train"]["batch_size"]) * int(config["data"]["seq_len"])
    curve = []
    with open(d / "metrics.jsonl") as f:
      for line in f:
        rec = json.loads(line)
        if isinstance(rec.get("eval_val_nll"), (int, float)):
          curve.append((rec["step"] * tokens_per_step, float(rec["eval_val_nll"])))
    labels = dict(cell["labels"])
    seed = labels.pop(SEED_AXIS, str(config.get("seed")))
    final = result.get("eval", {}).get("val")
    if final is None or not curve:
      skipped["no validation NLL"] += 1
      continue
    extra = {k: float(v) for k, v in result["eval"].items() if k != "val" and isinstance(v, (int, float))}
    bits = (result.get("eval_bits_per_byte") or {}).get("val")  # absent before runs recorded it
    cells.append({"run_id": cell["run_id"], "labels": labels, "seed": seed, "curve": dict(curve),
                  "final": float(final), "extra": extra, "bits_per_byte": bits,
                  "bytes_per_token": result.get("val_bytes_per_token"),
                  "val_bytes": (result.get("val_byte_counts") or {}).get("bytes"), "params": result["params_total"], "tokens": result["tokens"],
                  "wall_s": result.get("wall_time_sec"), "cpu_s": result.get("cpu_time_sec")})
  return cells, skipped


def _key(labels: dict) -> tuple:
  return tuple(sorted(labels.items()))


def _mean_sd(xs: list[float]) -> tuple[float, float]:
  return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


TREND_HORIZON = 100  # extrapolations past 100x the tokens trained are reported as not closing


def crossing(gap_curve: list[tuple[int, float]]) -> dict:
  """Where a mean gap curve [(tokens, Δ)] reaches 0: observed, or the late log-linear trend."""
  for (t0, g0), (t1, g1) in zip(gap_curve, gap_curve[1:]):
    if g0 > 0 >= g1:
      return {"kind": "observed", "tokens": t1}
  if gap_curve and gap_curve[0][1] <= 0:
    return {"kind": "ahead from the start", "tokens": gap_curve[0][0]}
  late = gap_curve[len(gap_curve) // 2:]
  if len(late) < 3:
    return {"kind": "too few evaluations"}
  xs, ys = [math.log(t) for t, _ in late], [g for _, g in late]
  mx, my = statistics.fmean(xs), statistics.fmean(ys)
  slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
  if slope >= 0:
    return {"kind": "not closing", "slope_per_e": slope}
  log_t = mx + (0.0 - my) / slope
  if log_t > math.log(TREND_HORIZON * gap_curve[-1][0]):  # a flat slope says "never" more honestly
    return {"kind": f"not closing within {TREND_HORIZON}x the budget", "slope_per_e": slope}
  return {"kind": "trend", "tokens": math.exp(log_t), "slope_per_e": slope}


def summarise(cells: list[dict], baseline: tuple[str, str] | None) -> list[dict]:
  """One row per arm: seeds, final NLL mean/sd, and the paired gap to the baseline arm."""
  arms = collections.defaultdict(list)
  for c in cells:
    arms[_key(c["labels"])].append(c)
  rows = []
  for key, runs in arms.items():
    labels = dict(key)
    mean, sd = _mean_sd([r["final"] for r in runs])
    row = {"labels": labels, "seeds": sorted(r["seed"] for r in runs), "nll_mean": mean, "nll_sd": sd,
           "params": runs[0]["params"], "tokens": runs[0]["tokens"],
           "wall_s_mean": statistics.fmean(r["wall_s"] or 0.0 for r in runs),
           "cpu_s_mean": statistics.fmean(r["cpu_s"] or 0.0 for r in runs), "extra": {}}
    if all(isinstance(r["bits_per_byte"], (int, float)) for r in runs):  # comparable across tokenizers
      row["bpb_mean"], row["bpb_sd"] = _mean_sd([r["bits_per_byte"] for r in runs])
      row["bytes_per_token"], row["val_bytes"] = runs[0]["bytes_per_token"], runs[0]["val_bytes"]
    for name in sorted(set.intersection(*(set(r["extra"]) for r in runs))):
      m, spread = _mean_sd([r["extra"][name] for r in runs])
      row["extra"][name] = {"mean": m, "sd": spread}
    if baseline and labels.get(baseline[0]) != baseline[1] and baseline[0] in labels:
      base_key = _key({**labels, baseline[0]: baseline[1]})
      base = {r["seed"]: r for r in arms.get(base_key, [])}
      pairs = [(r, base[r["seed"]]) for r in runs if r["seed"] in base]
      if pairs:
        gaps = [r["final"] - b["final"] for r, b in pairs]
        row["gap_mean"], row["gap_sd"] = _mean_sd(gaps)
        row["gap_seeds"] = len(pairs)
        steps = sorted(set.intersection(*(set(r["curve"]) & set(b["curve"]) for r, b in pairs)))
        curve = [(t, statistics.fmean(r["curve"][t] - b["curve"][t] for r, b in pairs)) for t in steps]
        row["gap_curve"] = curve
        row["catch"] = crossing(curve)
        if "bpb_mean" in row and all(isinstance(b["bits_per_byte"], (int, float)) for _, b in pairs):
          row["bpb_gap_mean"], row["bpb_gap_sd"] = _mean_sd([r["bits_per_byte"] - b["bits_per_byte"] for r, b in pairs])
        for name in row["extra"]:
          diffs = [r["extra"][name] - b["extra"][name] for r, b in pairs if name in b["extra"]]
          if len(diffs) == len(pairs):
            row["extra"][name]["gap_mean"], row["extra"][name]["gap_sd"] = _mean_sd(diffs)
    rows.append(row)
  rows.sort(key=lambda r: [str(v) for _, v in sorted(r["labels"].items())])
  return rows


def _fmt_tokens(t: float) -> str:
  return f"{t / 1e9:.3g}B" if t >= 1e9 else f"{t / 1e6:.3g}M" if t >= 1e6 else f"{t / 1e3:.3g}k" if t >= 1e3 else f"{t:.0f}"


def _catch_text(c: dict | None) -> str:
  if not c:
    return ""
  if "tokens" in c and c["kind"] != "trend":
    return f"{c['kind']} {_fmt_tokens(c['tokens'])}"
  if c["kind"] == "trend":
    return f"trend: {_fmt_tokens(c['tokens'])} (extrapolated)"
  return c["kind"]


def _extra_text(row: dict, name: str) -> str:
  e = row["extra"].get(name)
  if e is None:
    return "—"
  gap = f" ({e['gap_mean']:+.3f} ± {e['gap_sd']:.3f})" if "gap_mean" in e else ""
  return f"{e['mean']:.3f} ± {e['sd']:.3f}{gap}"


def _bpb_text(row: dict) -> str:
  if "bpb_mean" not in row:
    return "—"
  gap = f" ({row['bpb_gap_mean']:+.4f} ± {row['bpb_gap_sd']:.4f})" if "bpb_gap_mean" in row else ""
  return f"{row['bpb_mean']:.4f} ± {row['bpb_sd']:.4f}{gap}"


def _bytes_text(row: dict) -> str:
  if not row.get("bytes_per_token"):
    return "—"
  counted = f" ({row['val_bytes']:,})" if row.get("val_bytes") else ""
  return f"{row['bytes_per_token']:.3f}{counted}"


def markdown(rows: list[dict], axes: list[str]) -> str:
  """One line per arm; other evaluation sets (`nsl.evals.nll --data=NAME=DIR` merges them into
  result.json) get a column each where every seed of the arm has them."""
  extras = sorted({name for r in rows for name in r["extra"]})
  head = [*axes, "params", "seeds", "val NLL (mean ± sd)", "Δ vs baseline (paired)", "Δ first → last eval",
          "catches baseline", "val bits/byte (Δ)", "bytes/token (val bytes)", *(f"{name} NLL (Δ)" for name in extras)]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    gap = f"{r['gap_mean']:+.3f} ± {r['gap_sd']:.3f}" if "gap_mean" in r else "—"
    span = (f"{r['gap_curve'][0][1]:+.3f} → {r['gap_curve'][-1][1]:+.3f}" if r.get("gap_curve") else "—")
    cells = [str(r["labels"].get(a, "")) for a in axes]
    lines.append("| " + " | ".join([*cells, f"{r['params'] / 1e3:.0f}k", str(len(r["seeds"])),
                                     f"{r['nll_mean']:.3f} ± {r['nll_sd']:.3f}", gap, span,
                                     _catch_text(r.get("catch")), _bpb_text(r), _bytes_text(r),
                                     *(_extra_text(r, n) for n in extras)]) + " |")
  return "\n".join(lines)


def plot(cells: list[dict], rows: list[dict], panel: str | None, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = sorted({c["labels"].get(panel, "") for c in cells}) if panel else [""]
  fig, axes = plt.subplots(2, len(panels), figsize=(5.5 * len(panels), 7), squeeze=False)
  arms = collections.defaultdict(list)
  for c in cells:
    arms[_key(c["labels"])].append(c)
  for j, pv in enumerate(panels):
    ax, gx = axes[0][j], axes[1][j]
    for key, runs in sorted(arms.items()):
      labels = dict(key)
      if panel and labels.get(panel) != pv:
        continue
      name = ", ".join(str(v) for k, v in key if k != panel)
      steps = sorted(set.intersection(*(set(r["curve"]) for r in runs)))
      ys = [[r["curve"][t] for r in runs] for t in steps]
      line, = ax.plot(steps, [statistics.fmean(y) for y in ys], label=f"{name} ({len(runs)} seeds)")
      ax.fill_between(steps, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.2)
      row = next(r for r in rows if r["labels"] == labels)
      if row.get("gap_curve"):
        t, g = zip(*row["gap_curve"])
        gx.plot(t, g, color=line.get_color(), label=name)
    ax.set_title(f"{panel}={pv}" if panel else "validation NLL")
    ax.set_xscale("log")
    ax.set_ylabel("validation NLL (nats/token)")
    ax.legend(fontsize=7)
    gx.axhline(0.0, color="k", lw=0.8)
    gx.set_xscale("log")
    gx.set_xlabel("training tokens")
    gx.set_ylabel("Δ NLL vs baseline (paired mean)")
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)


@cli_main
def main(argv: list[str] | None = None) -> int:
  p = ArgumentParser(prog="python -m nsl.scaling.study", description=__doc__.split("\n")[0])
  p.add_argument("--root", required=True, help="a grid root with a seed axis")
  p.add_argument("--baseline", default="arm=standard", help="AXIS=LABEL of the arm gaps are taken to ('' = none)")
  p.add_argument("--panel", default="size", help="axis whose values get separate plot panels ('' = one)")
  p.add_argument("--plot", help="write the curves here (png)")
  p.add_argument("--json", help="write the rows here")
  a = p.parse_args(argv)
  baseline = None
  if a.baseline:
    if "=" not in a.baseline:
      p.error(f"--baseline={a.baseline!r} must be AXIS=LABEL, e.g. arm=standard")
    baseline = tuple(a.baseline.split("=", 1))
  cells, skipped = load_cells(a.root)
  if not cells:
    raise DataError(f"no finished cells under {a.root} ({dict(skipped) or 'no cell.json found'})")
  axes = sorted({k for c in cells for k in c["labels"]})
  rows = summarise(cells, baseline)
  print(markdown(rows, axes))
  if skipped:
    print(f"\nleft out: {', '.join(f'{n} {s}' for s, n in sorted(skipped.items()))}")
  if a.json:
    with open(a.json, "w") as f:
      json.dump({"root": a.root, "baseline": a.baseline, "rows": rows, "skipped": dict(skipped)}, f, indent=1)
  if a.plot:
    plot(cells, rows, a.panel or None, a.plot)
    print(f"plot: {a.plot}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
