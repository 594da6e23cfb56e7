"""Exact-match accuracy of a trained run on its planning task's test set (greedy decoding).

  python -m nsl.evals.planning --workdir=runs/nextlat_path_star [--limit=1000] [--batch_size=250]

Reads the run's config.json and latest checkpoint, the task test set of its data dir
(`task_test.npz`, nsl/data/tasks/task_data.py), decodes every prompt greedily with the family's
decoder (`family.generate`: the shared KV-cache decoder for standard, sps, nextlat, mtp; LIFT
with its own-state feedback; the double decoder's own; batched, all prompts of a task have the
same length) for the task's answer length, and scores with the task's checker (path-star: the ℓ path tokens exactly; countdown: any correct solution).
Prints one JSON line and writes it to WORKDIR/planning.json. For path-star it also reports the
accuracy of the first decision after the start node (`first_step_acc`): the token a
next-token-trained model gets only by chance 1/d ("Clever Hans", Bachmann & Nagarajan 2024).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from nsl.errors import ArgumentParser, cli_main


def load_run(workdir: str):
  """(config, family, params) of a trained run: `nsl.evals.common.load_run`."""
  from nsl.evals import common

  return common.load_run(workdir)


def greedy_batch(family, params, prompts_BN: np.ndarray, new_tokens: int) -> np.ndarray:
  """Greedy continuation [B, new_tokens] of same-length prompts with the family's decoder
  (`family.generate`: the shared KV-cache decoder, LIFT's own-state feedback decode)."""
  import jax.numpy as jnp

  return np.asarray(family.generate(params, jnp.asarray(prompts_BN, jnp.int32), new_tokens)[0])


def evaluate(workdir: str, limit: int | None = None, batch_size: int = 250, data_dir: str | None = None) -> dict:
  from nsl.data.tasks import task_data

  config, family, params = load_run(workdir)
  data_dir = data_dir or str(config.data.path)
  task = task_data.task_of(data_dir)
  prompts, answers = task_data.load_test(data_dir)
  if limit:
    prompts, answers = prompts[:limit], answers[:limit]
  t0 = time.time()
  outs = [greedy_batch(family, params, prompts[i:i + batch_size], task.answer_len())
          for i in range(0, len(prompts), batch_size)]
  outputs = np.concatenate(outs)
  correct = np.array([task.is_correct(p, o, a) for p, o, a in zip(prompts, outputs, answers)])
  result = {"workdir": workdir, "task": task.name, **task.params(), "family": config.family,
            "variant": config.model.variant, "test_problems": int(len(prompts)),
            "accuracy": float(correct.mean()), "seconds": round(time.time() - t0, 2)}
  if task.name == "path_star":
    result["first_step_acc"] = float(np.mean(outputs[:, 1] == answers[:, 1]))
    result["chance_first_step"] = 1.0 / task.d
  with open(os.path.join(workdir, "planning.json"), "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  return result


@cli_main
def main(argv=None) -> int:
  p = ArgumentParser(prog="python -m nsl.evals.planning", description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--limit", type=int, default=None, help="first N test problems only")
  p.add_argument("--batch_size", type=int, default=250)
  p.add_argument("--data", default=None, help="task data dir (default: the run's data.path)")
  a = p.parse_args(argv)
  print(json.dumps(evaluate(a.workdir, a.limit, a.batch_size, a.data)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
