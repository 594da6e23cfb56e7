"""What every evaluation of a finished run shares, for any family: `run_parser` starts its
command line; `eval_batches` gives the run's validation windows; `token_nll` the per-target NLL
of any family (`Family.token_logits`). Loading the run itself is `nsl.runs.load_run`.

jax and optax are imported where they are used, so a CLI's `--help` does not load them.
"""

from __future__ import annotations

import os
from typing import Any

from nsl.errors import ArgumentParser, NslError


def run_parser(module: str, doc: str) -> ArgumentParser:
  """The argument parser of `python -m nsl.evals.MODULE`, a command that evaluates one finished
  run: its description is the first line of `doc` (the module docstring), and `--workdir` names
  the run. Mistakes are one line and exit status 2 (`nsl.errors.ArgumentParser`)."""
  p = ArgumentParser(prog=f"python -m nsl.evals.{module}", description=doc.split("\n")[0])
  p.add_argument("--workdir", required=True, help="a finished run's directory (config.json + checkpoints/)")
  return p


def eval_batches(config, batch_size: int, max_batches: int | None = None, split: str = "val",
                 workdir: str | None = None):
  """The run's evaluation windows (`nsl.data.pipeline.make_eval_batches`, in order) from its own
  data dir (`nsl.data.rundata.data_dir`: where the run in `workdir` read it, else config.data.path)."""
  from nsl.data import pipeline, rundata

  path = rundata.data_dir(workdir, config, flag=None)
  return pipeline.make_eval_batches(path, split, seq_len=config.data.seq_len, batch_size=batch_size,
                                    max_batches=max_batches)


def token_nll(family, params, batch: dict[str, Any], model=None, view: str | None = None):
  """(nll [B, T], weights [B, T]): per-target negative log-likelihood of `family.token_logits`
  (under `model`, e.g. `family.with_rule(...)`; under the family's named `view`,
  `Family.view_logits`) and whether the target counts."""
  import jax.numpy as jnp
  import optax

  from nsl.nn import cross_entropy

  _, targets, _, weights = cross_entropy.next_token_targets(batch)
  if view is None:
    logits = family.token_logits(params, batch, model=model)
  else:
    logits = family.view_logits(params, batch, view, model=model)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  return nll * weights, weights


def grid_runs(root: str, unfinished: bool = False) -> list[tuple[str, str, str]]:
  """(run dir, group, seed) of every done cell under a grid root, the group its labels but the seed;
  with `unfinished`, also the cells still training or stopped that have a checkpoint to read."""
  from pathlib import Path

  from nsl.scaling import cells as cell_files

  out = []
  if not os.path.isdir(root):
    raise NslError(f"--root={root}: not a directory")
  for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    cell = cell_files.read_json(Path(d) / cell_files.CELL_FILE)
    if cell is None:
      continue
    if cell_files.result_status(Path(d)) != "done" and not (unfinished and _has_checkpoint(d)):
      continue
    labels = dict(cell.get("labels", {}))
    seed = str(labels.pop("seed", "?"))
    out.append((d, "-".join(str(v) for v in labels.values()) or name, seed))
  if not out:
    raise NslError(f"--root={root}: no done grid cells there (python -m nsl.scaling.grid status --root={root})")
  return out


def _has_checkpoint(run: str) -> bool:
  directory = os.path.join(run, "checkpoints")
  return os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))


def write_result(result: dict, out: str, plot) -> dict:
  """An analysis's record: `plot(result, path)` draws OUT's stem + .png, whose path goes into
  `result["plot"]`, then the result is written to `out` as JSON."""
  import json

  from nsl import storage

  if storage.is_remote(out):  # drawn and written locally, then copied up beside each other
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
      local = write_result(result, os.path.join(tmp, storage.basename(out)), plot)
      if result.get("plot"):
        png = os.path.splitext(out)[0] + ".png"
        storage.upload(result["plot"], png)
        result["plot"] = png
      storage.write_text(out, json.dumps(local, indent=1))
    return result
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  result["plot"] = plot(result, os.path.splitext(out)[0] + ".png")
  with open(out, "w") as f:
    json.dump(result, f, indent=1)
  return result


def forward_fn(family):
  """(params, tokens [B, T+1], segment [B, T+1], start [B]) -> next-token logits [B, T, V] of rows
  whose inputs from `start` on continue a prompt: `Family.continuation_logits`."""
  return lambda p, tok, seg, start: family.continuation_logits(p, {"tokens": tok, "segment": seg}, start)


def make_scorer(family, config):
  """The jitted (params, tokens [B, T+1], segment [B, T+1], start [B]) -> (log-probability of each
  next token [B, T], whether it is the argmax [B, T]) that `nsl.evals.lm_eval_model.NslLM` batches
  requests through, the inputs of row b from start[b] on the continuation of a prompt (the last
  context token; `Family.continuation_logits`); built once, it scores any parameters of the
  family's shapes without compiling again."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from nsl import sharding

  seq_len, rules = int(config.data.seq_len), sharding.rules(config)
  forward = forward_fn(family)

  @jax.jit
  def score(p, tok_BT1, seg_BT1, start_B):
    with nn.logical_axis_rules(rules):
      logits = forward(p, tok_BT1, seg_BT1, start_B)
    if logits.ndim != 3 or logits.shape[:2] != (tok_BT1.shape[0], seq_len):
      raise NslError(f"family {config.family!r} returned logits of shape {logits.shape}; its "
                     "Family.token_logits(params, batch) must return [B, T, V]")
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    targets = tok_BT1[:, 1:]
    lp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return lp, jnp.argmax(logits, axis=-1) == targets

  return score
