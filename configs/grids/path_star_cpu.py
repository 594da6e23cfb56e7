"""The CPU-scale path-star planning study (REFERENCES §4 "Path-Star", issue #17): GPT, NextLat
with the paper's losses and MTP on a small ladder of path-star settings.

The question: is there a path-star G_{d,ℓ} (degree d, arm length ℓ), graph count and model size
at which next-token GPT stays at the Clever-Hans level (first decision after the start node right
1/d of the time, every later edge followed) while NextLat solves it? The paper: 12L/6H/384d,
200k graphs, batch 512 × 20k steps, NextLat ≈ 100% on G_{2,10}, G_{5,5}, G_{7,7}, GPT fails.

Ladder (`LADDER`, from `SETTINGS`; every cell batch 64, lr 2e-3, WSD: 50 warmup steps, the last
20% decaying, `STEPS` = 1500 steps):
  g25_n20k_3L96   G_{2,5},  20k graphs, 3L/4H/96d  (the README's earlier setting; chance 1/2)
  g25_n100k_4L128 G_{2,5}, 100k graphs, 4L/4H/128d (more data and a wider, deeper trunk)
(`g35_n20k_3L96`, degree 3, stays defined and is not run: cut for the CPU budget.)
Arms (`ARMS`): `gpt` (configs/nextlat.py:gpt_path_star), `nextlat` (the paper's losses
λ_h = 1, λ_KL = 1, dynamics MLP hidden 384, d = 2, with the latent h read before the final norm,
`latent="residual"`), `mtp` (d = 2 heads), `nextlat_fn` (the same losses on the final-normed
latent, the family default). Cells, in run order:
  seed 0: every rung × gpt / nextlat / mtp, and nextlat_fn on the small rung     (7)
  seeds 1, 2: gpt and nextlat at `FINAL` (the rung seed 0 separated; MTP at seed 0 only)  (4)
  seed 0 at `FINAL`, `LONG_STEPS` = 3000 steps: nextlat and gpt (does the gap close?)  (2)
`FINAL` = g25_n100k_4L128: at 1,500 steps seed 0's NextLat had left the pre-edge-following
plateau there (first decision 40%, exact match 12%) and GPT had not (17%, 0%); on the small rung
GPT reached Clever Hans (48%) and NextLat (residual: L_next-h grew to ≈ 25 with the residual
stream's scale) did not leave the plateau. Done cells keep their ids when this file changes.

Curves: checkpoints every 100 steps, all kept; `python -m nsl.evals.planning_study --root=ROOT
--limit=500` scores every done cell's checkpoints (first-decision accuracy, exact match, beside
the CE / L_next-h / L_KL logged at that step), groups the seeds and writes
ROOT/planning_study.{json,md,png} (nsl/evals/planning_study.py).

Cost on this machine's 2 cores, shared by 3 runs (wall per 1,500-step cell): gpt 6 min, mtp
7 min, nextlat 14 min at g25_n20k_3L96; gpt 17 min, nextlat ≈ 17 min at g25_n100k_4L128.
Alone on 2 quiet cores about half that, so every model (the 3,000-step nextlat at ≈ 20 min
included) stays within 25 minutes.

  python -m nsl.scaling.grid run --grid=configs/grids/path_star_cpu.py --root=runs/path_star_cpu
  python -m nsl.evals.planning_study --root=runs/path_star_cpu --limit=500
"""

from configs import base
from configs import nextlat as nextlat_configs

SEEDS = (0, 1, 2)
STEPS = 1500
# name: (degree d, arm length ℓ, training graphs, layers, width); 4 heads, SwiGLU 3d, 1,000 test graphs.
SETTINGS = {
    "g25_n20k_3L96": (2, 5, 20_000, 3, 96),
    "g25_n100k_4L128": (2, 5, 100_000, 4, 128),
    "g35_n20k_3L96": (3, 5, 20_000, 3, 96),
}
LADDER = ("g25_n20k_3L96", "g25_n100k_4L128")  # seed 0's rungs; g35_n20k_3L96 cut for the CPU budget
FINAL = "g25_n100k_4L128"  # the setting of seeds 1 and 2 and of the long cells
FINAL_ARMS = ("gpt", "nextlat")  # MTP at seed 0 only, for the CPU budget
LONG_STEPS = 2 * STEPS  # seed 0 at FINAL again, twice as long: GPT's edge-following transition came at ~800 steps
PAPER_NEXTLAT = {"model.nextlat.lambda_h": 1.0, "model.nextlat.lambda_kl": 1.0, "model.nextlat.hidden": 384,
                 "model.nextlat.horizon": 2}
ARMS = {
    "gpt": {"config": "configs/nextlat.py:gpt_path_star"},
    "nextlat": {"config": "configs/nextlat.py:nextlat_path_star", **PAPER_NEXTLAT,
                "model.nextlat.latent": "residual"},
    "mtp": {"config": "configs/nextlat.py:mtp_path_star"},
    "nextlat_fn": {"config": "configs/nextlat.py:nextlat_path_star", **PAPER_NEXTLAT,
                   "model.nextlat.latent": "final_norm"},
}


def setting(name: str) -> dict:
  """One ladder rung as grid fields: the task data (nextlat_configs.path_star_data) and the trunk."""
  d, l, n_train, layers, width = SETTINGS[name]
  data = nextlat_configs.path_star_data(base.get_config(), d=d, l=l, n_train=n_train).data
  return {"_label": name, "data.sources": tuple(data.sources), "data.path": data.path, "data.seq_len": data.seq_len,
          "model.n_layers": layers, "model.d_model": width, "model.n_heads": 4, "model.d_ff": 3 * width}


def _common(steps: int) -> dict:
  """Training overrides of a cell of `steps` steps (WSD: 50 warmup steps, the last 20% decaying;
  a checkpoint every 100 steps, all kept, for the curves)."""
  return {"train.steps": steps, "train.warmup_steps": 50, "train.decay_steps": steps // 5,
          "train.log_every": 25, "train.eval_every": 250, "train.eval_batches": 4,
          "checkpoint.every": 100, "checkpoint.keep": steps // 100}


def _arm(name: str) -> dict:
  return {"_label": name, **ARMS[name]}


def get_grid():
  grids = [{"overrides": _common(STEPS), "axes": {"seed": [0], "size": [setting(s) for s in LADDER],
                                                  "config": [_arm(a) for a in ("gpt", "nextlat", "mtp")]}},
           {"overrides": _common(STEPS), "axes": {"seed": [0], "size": [setting(LADDER[0])],
                                                  "config": [_arm("nextlat_fn")]}}]
  for seed in SEEDS[1:]:
    grids.append({"overrides": _common(STEPS), "axes": {"seed": [seed], "size": [setting(FINAL)],
                                                        "config": [_arm(a) for a in FINAL_ARMS]}})
  grids.append({"overrides": {}, "axes": {"seed": [0], "size": [setting(FINAL)],
                                          "steps": [{"_label": f"{LONG_STEPS}steps", **_common(LONG_STEPS)}],
                                          "config": [_arm(a) for a in FINAL_ARMS[::-1]]}})
  return grids
