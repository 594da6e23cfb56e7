"""Small plots of one run, drawn into its workdir by `nsl.report` (the loss curve)."""

from __future__ import annotations

import json
import os


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend (no display on a training host), imported
  late: matplotlib costs seconds that only the commands that draw should pay."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save(fig, path: str, dpi: int = 110) -> str:
  """Lays out, writes and closes `fig`; returns `path`."""
  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  pyplot().close(fig)
  return path


def loss_curve(workdir: str) -> str | None:
  """Training loss and validation NLL against tokens -> WORKDIR/loss_curve.png."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  plt = pyplot()
  train, val = [], []
  tokens_at = {}
  with open(path) as f:
    for line in f:
      rec = json.loads(line)
      if "tokens" in rec:
        tokens_at[rec["step"]] = rec["tokens"]
      if isinstance(rec.get("loss"), (int, float)):
        train.append((rec["tokens"], rec["loss"]))
      if isinstance(rec.get("eval_val_nll"), (int, float)):
        val.append((rec["step"], rec["eval_val_nll"]))
  if not train:
    return None
  per_step = train[-1][0] / max(k for k in tokens_at) if tokens_at else 1
  fig, ax = plt.subplots(figsize=(7, 4.5))
  ax.plot([t for t, _ in train], [l for _, l in train], label="train loss (mean NLL per token)", lw=1.2)
  if val:
    ax.plot([s * per_step for s, _ in val], [l for _, l in val], "o-", label="validation NLL", lw=1.5)
  ax.set_xlabel("training tokens")
  ax.set_ylabel("nats per token")
  ax.set_title(f"nsl run {os.path.basename(os.path.normpath(workdir))}")
  ax.grid(alpha=0.3)
  ax.legend()
  return save(fig, os.path.join(workdir, "loss_curve.png"))
