"""Helpers shared by the cross-check harnesses (tools/xcheck/README.md): identical batches, curve
files, seed statistics, resumable jobs.

Runs in nsl's venv (and imports nothing from nsl at module level, so the authors' torch venv can
import it too: it needs only numpy). The API, kept small on purpose:

  dump_batches(config, out, steps)                        nsl's first `steps` training batches -> .npy
  load_batches(out)                                       -> {"tokens", "segment"} [N, B, T+1] int32
  CurveWriter(path) / read_curve(path)                    one JSON line per step {"step", "loss", ...}
  finished(path, steps)                                   a curve file that reached `steps` (resume)
  seed_stats(curves, lo, hi)                              per-seed means, mean curve, sd, se
  compare(a, b, lo, hi)                                   difference of two sides' mean curves (+ se)
  paired_gap(a, b, lo, hi)                                mean / worst |Δ| of two curves step by step
"""

from __future__ import annotations

import json
import math
import os
from typing import Iterable

import numpy as np

BATCH_FILES = ("train_tokens.npy", "train_segment.npy")


def dump_batches(config, out: str, steps: int) -> dict:
  """The first `steps` batches `nsl.train.loop.Trainer` draws for `config` (an nsl ConfigDict):
  the corpus prepared as the trainer prepares it, then the same `pipeline.make_train_iterator` call
  (data.path, data.seq_len, train.batch_size, seed), so an outside model trains on exactly nsl's
  tokens. Writes train_tokens.npy and train_segment.npy ([steps, batch, seq_len + 1] int32) and
  batches.json (what was dumped); a directory that already holds the same dump (or a longer one)
  is left as it is."""
  meta = {"data": os.path.abspath(config.data.path), "seq_len": int(config.data.seq_len),
          "batch": int(config.train.batch_size), "steps": int(steps), "seed": int(config.seed)}
  meta_path = os.path.join(out, "batches.json")
  if os.path.exists(meta_path) and all(os.path.exists(os.path.join(out, f)) for f in BATCH_FILES):
    with open(meta_path) as f:
      old = json.load(f)
    if {**old, "steps": steps} == meta and old["steps"] >= steps:  # a longer dump starts the same
      return old
  from nsl.data import pipeline  # late: the torch venv imports this module without nsl
  from nsl.train import loop

  loop.prepare_data(config)
  os.makedirs(out, exist_ok=True)
  it = pipeline.make_train_iterator(config.data.path, seq_len=config.data.seq_len,
                                    global_batch_size=config.train.batch_size, seed=config.seed)
  rows = [next(it) for _ in range(steps)]
  for name, key in zip(BATCH_FILES, ("tokens", "segment")):
    np.save(os.path.join(out, name), np.stack([np.asarray(r[key]) for r in rows]).astype(np.int32))
  with open(meta_path, "w") as f:
    json.dump(meta, f)
  return meta


def load_batches(out: str) -> dict[str, np.ndarray]:
  return {key: np.load(os.path.join(out, name)) for name, key in zip(BATCH_FILES, ("tokens", "segment"))}


class CurveWriter:
  """Appends one JSON line per step to a temporary file, renamed into place by `close`: a curve
  file that exists is a finished one, so an interrupted job simply runs again."""

  def __init__(self, path: str):
    self.path, self.tmp = path, path + ".part"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self.f = open(self.tmp, "w")

  def write(self, record: dict) -> None:
    self.f.write(json.dumps(record) + "\n")
    self.f.flush()

  def close(self) -> None:
    self.f.close()
    os.replace(self.tmp, self.path)


def read_curve(path: str, key: str = "loss") -> dict[int, float]:
  with open(path) as f:
    return {r["step"]: r[key] for r in map(json.loads, f) if key in r}


def finished(path: str, steps: int) -> bool:
  return os.path.exists(path) and max(read_curve(path), default=0) >= steps


def _window(curve: dict[int, float], lo: int, hi: int) -> np.ndarray:
  missing = [s for s in range(lo, hi + 1) if s not in curve]
  if missing:
    raise ValueError(f"curve lacks steps {missing[:3]}... of {lo}-{hi}")
  return np.array([curve[s] for s in range(lo, hi + 1)], np.float64)


def seed_stats(curves: dict[int, dict[int, float]], lo: int, hi: int) -> dict:
  """{seed: curve} -> per-seed mean loss over steps lo..hi, their mean (= the mean curve's mean),
  sd across seeds and standard error (sd / sqrt(n)), and the mean curve itself."""
  seeds = sorted(curves)
  w = np.stack([_window(curves[s], lo, hi) for s in seeds])  # [seeds, steps]
  per_seed = w.mean(axis=1)
  sd = float(per_seed.std(ddof=1)) if len(seeds) > 1 else None  # one seed: no spread (None in JSON)
  return {"seeds": seeds, "per_seed_mean": [round(float(x), 4) for x in per_seed],
          "mean": round(float(per_seed.mean()), 4), "sd": None if sd is None else round(sd, 4),
          "se": None if sd is None else round(sd / math.sqrt(len(seeds)), 4),
          "mean_curve": [round(float(x), 4) for x in w.mean(axis=0)], "steps": [lo, hi]}


def compare(a: dict, b: dict, lo: int, hi: int) -> dict:
  """Two sides' `seed_stats` (independent inits) -> Δ = mean(a) - mean(b) over lo..hi, its
  standard error sqrt(se_a² + se_b²), and whether |Δ| is within 0.04 or within 2 se (issue #45)."""
  delta = a["mean"] - b["mean"]
  if a["se"] is None or b["se"] is None:  # a side with one seed: no standard error to compare with
    return {"delta": round(delta, 4), "se": None, "within_0.04": abs(delta) <= 0.04, "within_2se": None,
            "pass": abs(delta) <= 0.04}
  se = math.sqrt(a["se"] ** 2 + b["se"] ** 2)
  return {"delta": round(delta, 4), "se": round(se, 4), "within_0.04": abs(delta) <= 0.04,
          "within_2se": abs(delta) <= 2 * se, "pass": abs(delta) <= 0.04 or abs(delta) <= 2 * se}


def paired_gap(a: dict[int, float], b: dict[int, float], lo: int = 1, hi: int | None = None) -> dict:
  """Mean and worst |a - b| over the steps both curves have in lo..hi (ported-weights runs)."""
  steps = [s for s in sorted(set(a) & set(b)) if s >= lo and (hi is None or s <= hi)]
  d = np.abs(np.array([a[s] - b[s] for s in steps]))
  i = int(d.argmax())
  return {"steps": len(steps), "mean_abs": round(float(d.mean()), 4), "worst_abs": round(float(d[i]), 4),
          "worst_step": steps[i], "mean_signed": round(float(np.mean([a[s] - b[s] for s in steps])), 4)}


def parse_seeds(spec: str) -> list[int]:
  """"0-4" or "0,2,5" -> [0, 1, 2, 3, 4] / [0, 2, 5]."""
  out: list[int] = []
  for part in spec.split(","):
    lo, _, hi = part.partition("-")
    out += list(range(int(lo), int(hi or lo) + 1))
  return out


def tensor_stats(named: Iterable[tuple[str, np.ndarray]]) -> dict[str, dict]:
  """Per-tensor statistics for comparing two sides' step-0 parameters: shape, mean, std, the
  fraction of exact zeros and the largest |x|."""
  out = {}
  for name, x in named:
    x = np.asarray(x, np.float64)
    out[name] = {"shape": list(x.shape), "mean": float(x.mean()), "std": float(x.std()),
                 "zeros": float((x == 0).mean()), "absmax": float(np.abs(x).max())}
  return out
