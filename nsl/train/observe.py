"""Watching a run from outside: a jax.profiler trace of chosen steps and a Weights & Biases mirror
of metrics.jsonl (docs/guide/training.md#profiling, docs/guide/training.md#weights-biases).

`validate` checks `train.profile_steps` and `config.log` (called by `nsl.config.validate`);
`check_wandb` is called by the trainer only, so configs are validated where wandb is not
installed (a grid listed on a laptop, `nsl.compile`).
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from nsl.errors import ConfigError, NslError

WANDB_MODES = ("", "online", "offline", "disabled")
WANDB_ID_FILE = "wandb_run_id"  # in the workdir: a resumed run continues the same W&B run


def validate(config) -> None:
  """`train.profile_steps`: (a, b) with 0 < a <= b <= train.steps, or None; `log.*`'s types."""
  steps = config.train.get("profile_steps")
  if steps is not None:
    ok = (isinstance(steps, (tuple, list)) and len(steps) == 2
          and all(isinstance(s, int) and not isinstance(s, bool) for s in steps))
    if not ok:
      raise ConfigError(f"config.train.profile_steps={steps!r} must be two step numbers (a, b), or None")
    a, b = steps
    if not 0 < a <= b <= config.train.steps:
      raise ConfigError(f"config.train.profile_steps=({a}, {b}) needs 0 < a <= b <= train.steps={config.train.steps}"
                        " (steps count from 1; a > 1 leaves the first step's compile out of the trace)")
  log = config.get("log")
  if log is None:
    return
  if not isinstance(log.get("wandb", False), bool):
    raise ConfigError(f"config.log.wandb={log.wandb!r} must be true or false")
  if log.get("wandb_mode", "") not in WANDB_MODES:
    raise ConfigError(f"config.log.wandb_mode={log.wandb_mode!r} must be one of {WANDB_MODES} (\"\": wandb's default)")
  if log.get("wandb") and not log.get("wandb_project"):
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
  log = config.get("log")
  if log is None or not log.get("wandb"):
    return
  try:
    import wandb  # noqa: F401
  except ImportError:
    raise ConfigError("config.log.wandb=true needs the wandb package: pip install 'nsl[wandb]' "
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
                            entity=log.get("wandb_entity") or None, mode=log.get("wandb_mode") or None,
                            dir=workdir, config=config_dict, id=run_id, resume="allow")
    except Exception as e:  # no network, no login, a bad entity: wandb's own words, on one line
      raise NslError(f"W&B did not start a run ({type(e).__name__}: {e}); log in with `wandb login`, or "
                     "set config.log.wandb_mode=offline (sync later) or config.log.wandb=false") from e

  def log(self, step: int, record: dict[str, Any]) -> None:
    self.run.log(record, step=step)

  def close(self) -> None:
    self.run.finish()
