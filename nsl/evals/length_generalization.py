"""Length generalization on S5 (REFERENCES §3): accuracy vs sequence length N per model.

  python -m nsl.evals.length_generalization --runs=runs/s5_standard,runs/s5_lift [--lengths=1-16,20,24,32,48,64]
      [--per_length=2000] [--data=DIR] [--out=DIR] [--feed=own|bias]

For each run (an nsl run dir trained on an S5 task dir, `nsl.data.tasks.s5`) and each N, the
accuracy is the fraction of the held-out sequences of length N (`heldout.npz`, 2,000 per N)
whose final state s_N is the argmax prediction at the last position. Standard (and any
non-LIFT) models run the sequence in parallel; LIFT-family models feed back their own states
token by token with the KV cache (`LiftFamily.feedback_logits`; `--feed=bias` switches the
channel off). Chance is 1/120. Prints a table (rows N, one column per run), writes
`length_generalization.json` and `length_generalization.png` to --out (default: the first run's
parent directory), and records `length_generalization` in each run's result.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from nsl.errors import NslError, cli_main

CHANCE = 1.0 / 120


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
  """(config, family, params) of a trained run: `nsl.evals.common.load_run`."""
  from nsl.evals import common

  return common.load_run(workdir)


def accuracy_by_length(family, params, heldout: dict, lengths: list[int], per_length: int, feed: str = "own",
                       batch_size: int = 500) -> dict[int, float]:
  """{N: final-state accuracy} of one model on the held-out sets."""
  import jax
  import jax.numpy as jnp

  is_lift = getattr(family, "name", "") == "lift"
  if is_lift:
    fwd = jax.jit(lambda p, t: family.feedback_logits(p, t, feed=feed))
  else:
    fwd = jax.jit(lambda p, t: family.model.apply({"params": p}, t, jnp.ones_like(t)))
  # Causal models: the prediction at position N depends only on tokens <= N, so every length is
  # padded to one width and read at its own last position (one compiled shape for all N).
  width = max(lengths) + 1
  out = {}
  for n in lengths:
    if n not in heldout:
      raise NslError(f"the held-out set has no sequences of length {n} (has 1..{max(heldout)})")
    tokens, labels = heldout[n]
    tokens, labels = tokens[:per_length], labels[:per_length]
    padded = np.zeros((len(tokens), width), np.int32)
    padded[:, :n + 1] = tokens
    correct = 0
    for i in range(0, len(tokens), batch_size):
      chunk = padded[i:i + batch_size]
      real = len(chunk)
      if real < batch_size:
        chunk = np.concatenate([chunk, np.zeros((batch_size - real, width), np.int32)])
      logits = fwd(params, jnp.asarray(chunk))
      pred = np.asarray(jnp.argmax(logits[:real, n], -1))
      correct += int(np.sum(pred == labels[i:i + batch_size, -1]))
    out[n] = correct / len(tokens)
  return out


def format_table(names: list[str], results: dict[str, dict[int, float]], lengths: list[int]) -> str:
  width = max(12, *(len(n) for n in names))
  lines = ["N".rjust(4) + "".join(n.rjust(width + 2) for n in names)]
  for n in lengths:
    lines.append(str(n).rjust(4) + "".join(f"{results[r][n]:.3f}".rjust(width + 2) for r in names))
  lines.append("chance = 1/120 = 0.008")
  return "\n".join(lines)


def chance_from(acc: dict[int, float], threshold: float = 2 * CHANCE) -> int | None:
  """Smallest N from which accuracy stays below `threshold` (2x chance)."""
  ns = sorted(acc)
  for i, n in enumerate(ns):
    if all(acc[m] < threshold for m in ns[i:]):
      return n
  return None


def plot(names, results, lengths, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  for name in names:
    ax.plot(lengths, [results[name][n] for n in lengths], marker="o", ms=3, label=name)
  ax.axhline(CHANCE, color="gray", ls=":", label="chance (1/120)")
  ax.axvline(16, color="gray", ls="--", lw=0.8, label="max train length")
  ax.set_xlabel("sequence length N")
  ax.set_ylabel("final-state accuracy")
  ax.set_ylim(-0.02, 1.02)
  ax.set_title("S5 length generalization")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m nsl.evals.length_generalization", description=__doc__.split("\n")[0])
  p.add_argument("--runs", required=True, help="comma-separated run directories")
  p.add_argument("--lengths", default="1-16,20,24,28,32,40,48,56,64")
  p.add_argument("--per_length", type=int, default=2000)
  p.add_argument("--batch_size", type=int, default=500)
  p.add_argument("--data", default="", help="S5 task dir (default: each run's data.path)")
  p.add_argument("--feed", default="own", choices=("own", "bias"), help="LIFT state channel at test")
  p.add_argument("--out", default="")
  a = p.parse_args(argv)
  from nsl.data.tasks import s5

  runs = [r for r in a.runs.split(",") if r]
  lengths = parse_lengths(a.lengths)
  results, names, meta = {}, [], {}
  for run in runs:
    config, family, params = load_run(run)
    data = a.data or str(config.data.path)
    heldout = s5.load_heldout(data)
    name = os.path.basename(os.path.normpath(run))
    acc = accuracy_by_length(family, params, heldout, lengths, a.per_length, a.feed, a.batch_size)
    names.append(name)
    results[name] = acc
    meta[name] = {"run": run, "family": config.family, "variant": config.model.variant,
                  "chance_from": chance_from(acc)}
    print(f"{name}: done", file=sys.stderr, flush=True)
    rpath = os.path.join(run, "result.json")
    if os.path.isfile(rpath):
      with open(rpath) as f:
        record = json.load(f)
      record["length_generalization"] = {"per_length": a.per_length, "feed": a.feed,
                                         "accuracy": {str(n): v for n, v in acc.items()}}
      with open(rpath, "w") as f:
        json.dump(record, f, indent=1)
  print(format_table(names, results, lengths))
  for name in names:
    print(f"{name}: below 2x chance from N={meta[name]['chance_from']}")
  out = a.out or os.path.dirname(os.path.abspath(os.path.normpath(runs[0])))
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "length_generalization.json"), "w") as f:
    json.dump({"lengths": lengths, "per_length": a.per_length, "feed": a.feed, "runs": meta,
               "accuracy": {k: {str(n): v for n, v in r.items()} for k, r in results.items()}}, f, indent=1)
  plot(names, results, lengths, os.path.join(out, "length_generalization.png"))
  print(f"wrote {os.path.join(out, 'length_generalization.png')}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(cli_main(main)())
