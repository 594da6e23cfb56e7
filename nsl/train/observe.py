"""Watching a run from outside: a jax.profiler trace of chosen steps, a Weights & Biases mirror
of metrics.jsonl and a trace of the training rows each step read (docs/guide/training.md#profiling,
docs/guide/training.md#weights-biases, docs/guide/training.md#elastic-resume).

`validate` checks `train.profile_steps` and `config.log` (called by `nsl.config.validate`);
`check_wandb` is called by the trainer only, so configs are validated where wandb is not
installed (a grid listed on a laptop, `nsl.compile`).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import secrets
from typing import Any

import numpy as np

from nsl.errors import ConfigError, NslError

WANDB_MODES = ("", "online", "offline", "disabled")
WANDB_ID_FILE = "wandb_run_id"  # in the workdir: a resumed run continues the same W&B run


def validate(config) -> None:
  """`train.profile_steps`: (a, b) with 0 < a <= b <= train.steps, or None; `log.*`'s types."""
  steps = config.train.profile_steps
  if steps is not None:
    ok = (isinstance(steps, (tuple, list)) and len(steps) == 2
          and all(isinstance(s, int) and not isinstance(s, bool) for s in steps))
    if not ok:
      raise ConfigError(f"config.train.profile_steps={steps!r} must be two step numbers (a, b), or None")
    a, b = steps
    if not 0 < a <= b <= config.train.steps:
      raise ConfigError(f"config.train.profile_steps=({a}, {b}) needs 0 < a <= b <= train.steps={config.train.steps}"
                        " (steps count from 1; a > 1 leaves the first step's compile out of the trace)")
  log = config.log
  if not isinstance(log.wandb, bool):
    raise ConfigError(f"config.log.wandb={log.wandb!r} must be true or false")
  if log.wandb_mode not in WANDB_MODES:
    raise ConfigError(f"config.log.wandb_mode={log.wandb_mode!r} must be one of {WANDB_MODES} (\"\": wandb's default)")
  if not isinstance(log.data_trace, bool):
    raise ConfigError(f"config.log.data_trace={log.data_trace!r} must be true or false")
  if log.wandb and not log.wandb_project:
    raise ConfigError("config.log.wandb_project is empty; name the W&B project the run logs to")


class StepProfiler:
  """A jax.profiler trace of steps a..b (1-based, inclusive) into `<workdir>/profile`, whose
  `plugins/profile/<time>/<host>.xplane.pb` TensorBoard's profile plugin opens
  (`tensorboard --logdir <workdir>/profile`). Every process traces its own host."""

  def __init__(self, steps, workdir: str, log=print):
    self.window = tuple(steps) if steps is not None else None
    self.directory = os.path.join(workdir, "profile")
    self.active = False
    self._log = log

  def before_step(self, step: int) -> None:
    """Called before step `step` (1-based) runs: starts the trace at the window's first step
    (or at the first step of a run resumed inside the window)."""
    if self.window and not self.active and self.window[0] <= step <= self.window[1]:
      import jax

      os.makedirs(self.directory, exist_ok=True)
      jax.profiler.start_trace(self.directory)
      self.active = True

  def after_step(self, step: int, state) -> None:
    """Called after step `step`: at the window's last step, waits for the device work of the
    traced steps (dispatch is asynchronous) and writes the trace."""
    if self.active and step >= self.window[1]:
      import jax

      jax.block_until_ready(state)
      self.close()
      self._log(f"profile of steps {self.window[0]}..{self.window[1]} in {self.directory} "
                f"(tensorboard --logdir {self.directory})")

  def close(self) -> None:
    """Stops a running trace (a run that ends or fails inside the window keeps what it traced)."""
    if self.active:
      import jax

      self.active = False
      jax.profiler.stop_trace()


def check_wandb(config) -> None:
  """ConfigError when log.wandb is on and the wandb package is missing (before any compile)."""
  if not config.log.wandb:
    return
  try:
    import wandb  # noqa: F401
  except ImportError:
    raise ConfigError("config.log.wandb=true needs the wandb package: pip install -e '.[wandb]' "
                      "(or set config.log.wandb=false)") from None


class WandbSink:
  """Mirrors each metrics.jsonl record to a W&B run (the run's config as its config). The run's
  W&B id is kept in <workdir>/wandb_run_id, so a resumed run continues the same W&B run; W&B's
  own files go under <workdir>/wandb (offline runs: `wandb sync` them later)."""

  def __init__(self, config, workdir: str, config_dict: dict[str, Any]):
    import wandb

    log = config.log
    id_path = os.path.join(workdir, WANDB_ID_FILE)
    if os.path.isfile(id_path):
      with open(id_path, encoding="utf-8") as f:
        run_id = f.read().strip()
    else:
      run_id = secrets.token_hex(4)  # W&B ids are letters and digits; 8 hex digits as wandb's own
      with open(id_path, "w", encoding="utf-8") as f:
        f.write(run_id + "\n")
    try:
      self.run = wandb.init(project=log.wandb_project, name=log.wandb_name or os.path.basename(workdir),
                            entity=log.wandb_entity or None, mode=log.wandb_mode or None,
                            dir=workdir, config=config_dict, id=run_id, resume="allow")
    except Exception as e:  # no network, no login, a bad entity: wandb's own words, on one line
      raise NslError(f"W&B did not start a run ({type(e).__name__}: {e}); log in with `wandb login`, or "
                     "set config.log.wandb_mode=offline (sync later) or config.log.wandb=false") from e

  def log(self, step: int, record: dict[str, Any]) -> None:
    self.run.log(record, step=step)

  def close(self) -> None:
    self.run.finish()


class DataTrace:
  """`log.data_trace`: every process appends one line per step to
  `<workdir>/data_trace/process_P-of-N.jsonl`, `{"step", "first_row", "rows"}`: where its rows
  start in the pipeline's global batch and a 64-bit BLAKE2b hash of each row's tokens. Joined
  over the processes by `first_row`, a step's lines are the global batch it trained on, whatever
  the process count, so runs resumed onto other counts can be compared with an uninterrupted one
  row by row (docs/guide/training.md#elastic-resume). On resume, lines after the checkpoint's
  step (steps the run replays) are dropped first: each process trims its own file, process 0
  also those of other process counts (no process of this run writes them)."""

  DIR = "data_trace"

  def __init__(self, enabled: bool, workdir: str, resume_step: int, process_index: int, process_count: int):
    from nsl import metrics

    self._file = None
    if not enabled:
      return
    directory = os.path.join(workdir, self.DIR)
    os.makedirs(directory, exist_ok=True)
    suffix = f"-of-{process_count}.jsonl"
    path = os.path.join(directory, f"process_{process_index}{suffix}")
    others = [p for p in glob.glob(os.path.join(directory, "process_*.jsonl")) if not p.endswith(suffix)]
    for p in [path] + (others if process_index == 0 else []):
      metrics.truncate_records(p, resume_step)
    self._file = open(path, "a", buffering=1)
    self._index = process_index

  def write(self, step: int, local_batch: dict[str, np.ndarray]) -> None:
    """Records step `step`'s rows of this process (`local_batch["tokens"]`, [rows, seq_len + 1])."""
    if self._file is None:
      return
    tokens = np.ascontiguousarray(np.asarray(local_batch["tokens"]).astype("<i4", copy=False))
    rows = [hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in tokens]
    self._file.write(json.dumps({"step": int(step), "first_row": self._index * len(rows), "rows": rows}) + "\n")

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


def read_data_trace(workdir: str) -> dict[int, list[str]]:
  """{step: the row hashes of its global batch in pipeline order} from a run's `data_trace/`. A
  step whose lines do not tile its batch exactly once (a row missing or read twice) is an error."""
  parts: dict[int, dict[int, list[str]]] = {}
  for path in sorted(glob.glob(os.path.join(workdir, DataTrace.DIR, "process_*.jsonl"))):
    with open(path, encoding="utf-8") as f:
      for line in f:
        r = json.loads(line)
        step = parts.setdefault(int(r["step"]), {})
        if r["first_row"] in step:
          raise ValueError(f"{path}: step {r['step']} rows from {r['first_row']} were recorded twice")
        step[int(r["first_row"])] = r["rows"]
  out = {}
  for step, by_first in sorted(parts.items()):
    rows, expect = [], 0
    for first, hashes in sorted(by_first.items()):
      if first != expect:
        raise ValueError(f"{workdir}: step {step} has rows {expect}..{first - 1} missing or overlapping")
      rows += hashes
      expect += len(hashes)
    out[step] = rows
  return out
