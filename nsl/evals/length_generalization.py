"""Length generalization on S5 and procedural evaluation on arithmetic (docs/papers/lift.md#s5): accuracy
against the sequence length N (S5) or the operand count m (arithmetic), per model.

  python -m nsl.evals.length_generalization --runs=runs/s5_standard,runs/s5_lift [--lengths=1-16,20,24,32,48,64]
      [--per_length=2000] [--data=DIR] [--out=DIR] [--view=NAME]
  python -m nsl.evals.length_generalization --root=runs/s5 [--force]    # every done cell of a grid root

Each run is an nsl run dir trained on an S5 or arithmetic task dir (`nsl.data.tasks.s5`,
`.arithmetic`); the task comes from the data dir's manifest.
- S5: for each N, the fraction of the held-out sequences of length N (`heldout.npz`, 2,000 per
  N) whose final state s_N is the argmax prediction at the last position. Chance is 1/120.
- Arithmetic: for each m = 2..10 (default lengths), the fraction of held-out problems whose every
  answer token (and its EOS) is the argmax prediction under teacher forcing, which equals greedy
  exact match of the answer.
Every model is scored by its family's logits under a named view (`Family.views`,
`view_logits`; `--view`, also `--feed`, default `own`; a family without that view is read under
its default): most run the sequence in parallel; LIFT-family models feed back the states they use
at inference token by token with the KV cache (their view `own`; `--view=bias` switches the
channel off). Prints a table (rows N or m, one column per run), writes
`length_generalization.json` and `length_generalization.png` to --out (default: the first run's
parent directory), and records `length_generalization` plus the view's suffix
(`Family.view_suffix`: `length_generalization_feed_bias` for a LIFT run with `--view=bias`) in
each run's result.json.

`--root=ROOT` takes every done cell of a grid root (`nsl.scaling.grid`; e.g. configs/grids/s5.py)
instead of `--runs`, reuses a cell's recorded accuracies when they cover the same lengths, view
and per-length count (`--force` re-scores), and groups the cells by their grid labels other than
the seed: one row per group with the seeds' mean ± sd at each length, the length each seed solves
to (accuracy >= 0.99 at every N up to it) and where each falls below 2x chance; the plot draws each
group's mean and its seeds' range. The rows and table go to length_generalization.json under
"groups" (--out, default ROOT).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from nsl.errors import ArgumentParser, NslError, cli_main
from nsl import runs
from nsl.evals import kinds

CHANCE = 1.0 / 120
# What the rows are, the default rows, chance (None: not meaningful) and the longest trained row.
TASKS = {
    "s5": {"axis": "sequence length N", "lengths": "1-16,20,24,28,32,40,48,56,64", "chance": CHANCE, "train_max": 16},
    "arithmetic": {"axis": "operands m", "lengths": "2-10", "chance": None, "train_max": None},
}


def task_name(data_dir: str) -> str:
  from nsl.data import prepare

  name = prepare.load_manifest(data_dir).get("task", {}).get("name")
  if name not in TASKS:
    raise NslError(f"{data_dir} holds task {name!r}; length generalization reads {sorted(TASKS)} task dirs "
                   "(python -m nsl.data.tasks.s5 --out=DIR)")
  return name


def parse_lengths(spec: str) -> list[int]:
  out: list[int] = []
  for part in spec.split(","):
    part = part.strip()
    if not part:
      continue
    try:
      if "-" in part:
        a, b = part.split("-")
        out.extend(range(int(a), int(b) + 1))
      else:
        out.append(int(part))
    except ValueError:
      raise NslError(f"--lengths={spec!r}: {part!r} is not N or A-B") from None
  return sorted(set(out))


def load_run(workdir: str):
  """(config, family, params) of a trained run: `nsl.runs.load_run`."""

  return runs.load_run(workdir, flag="--runs")


def family_view(family, view: str) -> str:
  """`view` when the family has it, else its default view (a family that reads a row one way)."""
  return view if view in family.views() else family.views()[0]


def make_forward(family, view: str = "own"):
  """The jitted (params, tokens [B, N]) -> next-token logits [B, N, V] that scores every row
  under the family's `view` (`family_view`); built once, reused at every length."""
  import jax
  import jax.numpy as jnp

  view = family_view(family, view)

  def logits(p, t_BN):  # one document per row; the appended column is a target no row reads
    tokens = jnp.concatenate([t_BN, jnp.zeros_like(t_BN[:, :1])], axis=1)
    return family.view_logits(p, {"tokens": tokens, "segment": jnp.ones_like(tokens)}, view)

  return jax.jit(logits)


def accuracy_by_length(family, params, heldout: dict, lengths: list[int], per_length: int, view: str = "own",
                       batch_size: int = 2000, task: str = "s5", fwd=None) -> dict[int, float]:
  """{N: accuracy} of one model on the held-out sets: the final state (S5), or every labelled
  answer position (arithmetic, whose held-out windows all have one width). `fwd`: a
  `make_forward(family, view)` to reuse."""
  import jax.numpy as jnp

  fwd = fwd or make_forward(family, view)
  # Causal models: the prediction at position N depends only on tokens <= N, so each S5 length
  # is padded to the next multiple of 16 and read at its own last position: a few compiled
  # shapes, and a LIFT model's sequential feedback runs ~N steps, not max(N).
  out = {}
  for n in lengths:
    if n not in heldout:
      raise NslError(f"the held-out set has no rows for {TASKS[task]['axis']} {n} (has {min(heldout)}..{max(heldout)})")
    width = -(-(n + 1) // 16) * 16 if task == "s5" else heldout[n][0].shape[1]
    tokens, labels = heldout[n]
    tokens, labels = tokens[:per_length], labels[:per_length]
    padded = np.zeros((len(tokens), width), np.int32)
    padded[:, :tokens.shape[1]] = tokens
    correct = 0
    for i in range(0, len(tokens), batch_size):
      chunk = padded[i:i + batch_size]
      real = len(chunk)
      if real < batch_size:
        chunk = np.concatenate([chunk, np.zeros((batch_size - real, width), np.int32)])
      pred = np.asarray(jnp.argmax(fwd(params, jnp.asarray(chunk))[:real], -1))
      lab = labels[i:i + batch_size]
      if task == "s5":
        correct += int(np.sum(pred[:, n] == lab[:, -1]))
      else:
        correct += int(np.sum(np.where(lab >= 0, pred == lab, True).all(axis=1)))
    out[n] = correct / len(tokens)
  return out


def evaluate(family, params, data_dir: str, lengths_spec: str = "", per_length: int = 2000, view: str = "own",
             batch_size: int = 2000, fwd=None) -> tuple[str, list[int], dict[int, float]]:
  """(task, lengths, {N: accuracy}) of live `params` on the S5 or arithmetic task dir `data_dir`
  (`lengths_spec`: rows such as "1-16,32"; "" = the task's default rows): this command's and the
  trainer's length_generalization evaluator's scores."""
  from nsl.data.tasks import s5

  task = task_name(data_dir)
  lengths = parse_lengths(lengths_spec or TASKS[task]["lengths"])
  acc = accuracy_by_length(family, params, s5.load_heldout(data_dir), lengths, per_length, view, batch_size, task, fwd)
  return task, lengths, acc


def _recorded(run: str, key: str, per_length: int, lengths: list[int]) -> dict[int, float] | None:
  """The accuracies a run's result.json records under `key`, if they cover `lengths` at `per_length`."""
  try:
    with open(os.path.join(run, "result.json")) as f:
      rec = json.load(f).get(key) or {}
  except (OSError, ValueError):
    return None
  acc = {int(n): float(v) for n, v in (rec.get("accuracy") or {}).items()}
  if rec.get("per_length") != per_length or not set(lengths) <= set(acc):
    return None
  return {n: acc[n] for n in lengths}


def format_table(names: list[str], results: dict[str, dict[int, float]], lengths: list[int], task: str = "s5") -> str:
  width = max(12, *(len(n) for n in names))
  lines = [TASKS[task]["axis"].split()[-1].rjust(4) + "".join(n.rjust(width + 2) for n in names)]
  for n in lengths:
    lines.append(str(n).rjust(4) + "".join(f"{results[r][n]:.3f}".rjust(width + 2) for r in names))
  if TASKS[task]["chance"]:
    lines.append(f"chance = {TASKS[task]['chance']:.3f}")
  return "\n".join(lines)


def chance_from(acc: dict[int, float], threshold: float = 2 * CHANCE) -> int | None:
  """Smallest N from which accuracy stays below `threshold` (2x chance)."""
  ns = sorted(acc)
  for i, n in enumerate(ns):
    if all(acc[m] < threshold for m in ns[i:]):
      return n
  return None


def solved_to(acc: dict[int, float], threshold: float = 0.99) -> int:
  """Largest N with accuracy >= threshold at every length up to it (0: not even the shortest)."""
  best = 0
  for n in sorted(acc):
    if acc[n] < threshold:
      break
    best = n
  return best


def group_rows(results: dict[str, dict[int, float]], members: dict[str, list[tuple[str, str]]],
               lengths: list[int], chance: float | None) -> list[dict]:
  """Per group: seeds, mean and sd of accuracy per length, and each seed's solved-to / chance-from."""
  rows = []
  for group, group_runs in members.items():
    group_runs = sorted(group_runs, key=lambda r: r[1])
    accs = np.array([[results[name][n] for n in lengths] for name, _ in group_runs])
    row = {"group": group, "seeds": [seed for _, seed in group_runs], "runs": [name for name, _ in group_runs],
           "mean": dict(zip(lengths, accs.mean(0).tolist())), "sd": dict(zip(lengths, accs.std(0).tolist())),
           "min": dict(zip(lengths, accs.min(0).tolist())), "max": dict(zip(lengths, accs.max(0).tolist())),
           "solved_to": [solved_to(results[name]) for name, _ in group_runs]}
    if chance:
      row["chance_from"] = [chance_from(results[name], 2 * chance) for name, _ in group_runs]
    rows.append(row)
  return rows


def group_table(rows: list[dict], columns: list[int]) -> str:
  """Markdown: a row per group, accuracy mean ± sd over its seeds at `columns`."""
  head = ["run", "seeds", "solved (≥ 0.99) to N, per seed"] + [f"N = {n}" for n in columns]
  if any("chance_from" in r for r in rows):
    head.append("below 2× chance from N, per seed")
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [f"`{r['group']}`", str(len(r["seeds"])), ", ".join(map(str, r["solved_to"]))]
    cells += [f"{100 * r['mean'][n]:.1f} ± {100 * r['sd'][n]:.1f}%" for n in columns]
    if "chance_from" in r:
      cells.append(", ".join("never" if c is None else str(c) for c in r["chance_from"]))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(names, results, lengths, path: str, task: str = "s5", groups: list[dict] | None = None) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  for name in names if groups is None else []:
    ax.plot(lengths, [results[name][n] for n in lengths], marker="o", ms=3, label=name)
  for g in groups or []:
    line, = ax.plot(lengths, [g["mean"][n] for n in lengths], marker="o", ms=3,
                    label=f"{g['group']} ({len(g['seeds'])} seeds)")
    ax.fill_between(lengths, [g["min"][n] for n in lengths], [g["max"][n] for n in lengths],
                    color=line.get_color(), alpha=0.15, lw=0)
  spec = TASKS[task]
  if spec["chance"]:
    ax.axhline(spec["chance"], color="gray", ls=":", label=f"chance ({spec['chance']:.3f})")
  if spec["train_max"]:
    ax.axvline(spec["train_max"], color="gray", ls="--", lw=0.8, label="max train length")
  ax.set_xlabel(spec["axis"])
  ax.set_ylabel("final-state accuracy" if task == "s5" else "exact-match answer accuracy")
  ax.set_ylim(-0.02, 1.02)
  ax.set_title("S5 length generalization" if task == "s5" else "arithmetic by operand count")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None) -> int:
  p = ArgumentParser(prog="python -m nsl.evals.length_generalization", description=__doc__.split("\n")[0])
  p.add_argument("--runs", default="", help="comma-separated run directories")
  p.add_argument("--root", default="", help="a grid root: every done cell, grouped by its labels but the seed")
  p.add_argument("--force", action="store_true", help="with --root: re-score cells that have a record")
  # --data, --lengths, --per_length, --batch_size, --view: the fields of config.evals' kind
  kinds.add_flags(p, kinds.LengthGeneralization)
  p.add_argument("--out", default="", help="where to write the JSON record (default: each run's workdir)")
  a = p.parse_args(argv)
  from nsl.data import rundata
  from nsl.evals import common

  kinds.check_flags(a, kinds.LengthGeneralization)

  if bool(a.runs) == bool(a.root):
    raise NslError("give --runs=A,B,... or --root=GRID_ROOT (one of them)")
  cells = common.grid_runs(a.root) if a.root else None
  runs = [d for d, _, _ in cells] if cells else [r for r in a.runs.split(",") if r]
  results, names, meta, task, lengths = {}, [], {}, None, []
  for run in runs:
    config, family, params = load_run(run)
    data = a.data or rundata.data_dir(run, config)  # where the run read it, else data.path from here
    this_task = task_name(data)
    if task is None:
      task, lengths = this_task, parse_lengths(a.lengths or TASKS[this_task]["lengths"])
    elif this_task != task:
      raise NslError(f"{run} was trained on {this_task}, {runs[0]} on {task}: compare runs of one task")
    name = os.path.basename(os.path.normpath(run))
    view = family_view(family, a.view)
    key = "length_generalization" + family.view_suffix(view)
    acc = None if not a.root or a.force else _recorded(run, key, a.per_length, lengths)
    if acc is None:
      _, _, acc = evaluate(family, params, data, ",".join(map(str, lengths)), a.per_length, view, a.batch_size)
    names.append(name)
    results[name] = acc
    meta[name] = {"run": run, "family": config.family, "variant": config.model.variant}
    if TASKS[task]["chance"]:
      meta[name]["chance_from"] = chance_from(acc, 2 * TASKS[task]["chance"])
    print(f"{name}: done", file=sys.stderr, flush=True)
    rpath = os.path.join(run, "result.json")
    if os.path.isfile(rpath):
      with open(rpath) as f:
        record = json.load(f)
      # One record per view, so a channel-off evaluation never replaces the own-state one.
      record[key] = {"per_length": a.per_length, "view": view, "accuracy": {str(n): v for n, v in acc.items()}}
      with open(rpath, "w") as f:
        json.dump(record, f, indent=1)
  print(format_table(names, results, lengths, task))
  for name in names:
    if "chance_from" in meta[name]:
      print(f"{name}: below 2x chance from N={meta[name]['chance_from']}")
  out = a.out or a.root or os.path.dirname(os.path.abspath(os.path.normpath(runs[0])))
  os.makedirs(out, exist_ok=True)
  summary = {"task": task, "lengths": lengths, "per_length": a.per_length, "view": a.view, "runs": meta,
             "accuracy": {k: {str(n): v for n, v in r.items()} for k, r in results.items()}}
  groups = None
  if cells:
    members: dict[str, list] = {}
    for d, group, seed in cells:
      members.setdefault(group, []).append((os.path.basename(os.path.normpath(d)), seed))
    groups = group_rows(results, members, lengths, TASKS[task]["chance"])
    columns = [n for n in (8, 16, 32, 64) if n in lengths] or lengths[-3:]
    summary["groups"] = {"rows": groups, "table": group_table(groups, columns)}
    print(summary["groups"]["table"])
  with open(os.path.join(out, "length_generalization.json"), "w") as f:
    json.dump(summary, f, indent=1)
  plot(names, results, lengths, os.path.join(out, "length_generalization.png"), task, groups)
  print(f"wrote {os.path.join(out, 'length_generalization.png')}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(cli_main(main)())
