"""Cost and early learning of the path-star study cell (configs/grids/path_star_cpu.py) before
launching it: a few hundred steps of one arm with nsl's own train step on the study's data,
the process's CPU seconds per step (time.process_time: every thread, the unit of the study's
budget) and wall seconds beside the machine's load, and every `--eval_every` steps the
teacher-forced first decision (the token after the start node, right 1/d of the time at the
Clever-Hans level) and exact path on `--eval_n` test problems.

  nice -n 10 .venv/bin/python tools/xcheck/nextlat_cost.py --arm=nextlat --layers=2 --heads=4 --width=64 \
      --steps=200 --eval_every=50 --out=runs/path_star_cost/nextlat_2L64.jsonl

Teacher-forced decisions equal greedy decoding's whenever the earlier path tokens are right;
the study's curves come from `nsl.evals.planning_study` (decoding).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def cell_config(arm: str, layers: int, heads: int, width: int, d: int = 5, l: int = 5, n_train: int = 200_000):
  """configs/nextlat.py's `{arm}_path_star` (the authors' recipe) on G_{d,ℓ} at a CPU size, as the
  grid builds its cells."""
  from configs import nextlat as nextlat_configs
  from nsl.models.latent_spec import authors_hidden

  c = nextlat_configs.get_config(f"{arm}_path_star")
  nextlat_configs.path_star_data(c, d=d, l=l, n_train=n_train, n_test=20_000)
  nextlat_configs.path_star_model(c, layers=layers, heads=heads, width=width)
  if "nextlat" in c.model:
    c.nextlat.hidden = authors_hidden(width)
  return c


def decisions(family, params, docs: np.ndarray, prompt_len: int) -> tuple[float, float]:
  """(first-decision accuracy, exact-path accuracy), teacher-forced, on whole test documents."""
  import jax.numpy as jnp

  batch = {"tokens": jnp.asarray(docs), "segment": jnp.ones(docs.shape, jnp.int32)}
  pred = np.asarray(jnp.argmax(family.token_logits(params, batch), axis=-1))  # pred[:, t] predicts docs[:, t + 1]
  path = slice(prompt_len - 1, docs.shape[1] - 2)  # predictions of p_1 .. p_ℓ
  right = pred[:, path] == docs[:, prompt_len:docs.shape[1] - 1]
  return float(right[:, 1].mean()), float(right.all(axis=1).mean())


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="tools/xcheck/nextlat_cost.py")
  p.add_argument("--arm", choices=("nextlat", "gpt", "mtp"), default="nextlat")
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--width", type=int, default=64)
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--eval_every", type=int, default=50)
  p.add_argument("--eval_n", type=int, default=500)
  p.add_argument("--out", required=True)
  a = p.parse_args(argv)
  import flax.linen as nn
  import jax

  from nsl.data import pipeline
  from nsl.data.tasks import path_star, planning_dir
  from nsl.models import registry
  from nsl.train import loop
  from nsl.train import state as train_state
  from nsl.train import step as step_lib

  c = cell_config(a.arm, a.layers, a.heads, a.width)
  loop.prepare_data(c)
  family = registry.get_family(c)
  params = nn.unbox(family.init(jax.random.PRNGKey(0)))
  optimizer = train_state.make_optimizer(c)
  state = train_state.create(params, optimizer)
  step_fn = jax.jit(step_lib.make_train_step(family, c, 1))
  schedule = train_state.schedule_args(c)
  it = pipeline.make_train_iterator(c.data.path, seq_len=c.data.seq_len, global_batch_size=c.train.batch_size,
                                    seed=c.seed)
  prompts, answers = planning_dir.load_test(c.data.path)
  docs = path_star.PathStar(d=5, l=5).documents(prompts[:a.eval_n], answers[:a.eval_n])
  prompt_len = prompts.shape[1]
  os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
  rng = jax.random.PRNGKey(0)
  counts = family.param_counts()
  with open(a.out, "w") as f:
    f.write(json.dumps({"config": {"arm": a.arm, "layers": a.layers, "heads": a.heads, "width": a.width,
                                   "batch": c.train.batch_size, "seq_len": c.data.seq_len, **counts,
                                   "flops_per_token": family.flops_per_token()}}) + "\n")
    for s in range(1, a.steps + 1):
      cpu0, wall0 = time.process_time(), time.perf_counter()
      state, m = step_fn(state, next(it), rng, schedule)
      loss = float(m["loss"])
      rec = {"step": s, "loss": loss, "ce": float(m.get("ce", m["loss"])), "cpu_s": time.process_time() - cpu0,
             "wall_s": time.perf_counter() - wall0, "load1": os.getloadavg()[0]}
      if s % a.eval_every == 0 or s == a.steps:
        rec["first_decision"], rec["exact_path"] = decisions(family, state.params, docs, prompt_len)
      f.write(json.dumps(rec) + "\n")
      f.flush()
  steady = [json.loads(x) for x in open(a.out)][3:]  # after the compile step and two warm ones
  cpu = float(np.median([r["cpu_s"] for r in steady if "cpu_s" in r]))
  print(json.dumps({"arm": a.arm, "size": f"{a.layers}L/{a.heads}H/{a.width}d", "cpu_s_per_step_median": cpu,
                    "params": counts["params_total"], "last": rec}))


if __name__ == "__main__":
  main()
