"""The CPU-scale path-star planning study (REFERENCES §4 "Path-Star", issue #17): GPT, NextLat
with the paper's losses and MTP on a small ladder of path-star settings, seeds outermost.

The question: is there a path-star G_{d,ℓ} (degree d, arm length ℓ), graph count and model size
at which next-token GPT stays at the Clever-Hans level (first decision after the start node right
1/d of the time, every later edge followed) while NextLat solves it? The paper: 12L/6H/384d,
200k graphs, batch 512 × 20k steps, NextLat ≈ 100% on G_{2,10}, G_{5,5}, G_{7,7}, GPT fails.

Ladder (`SETTINGS`; every cell batch 64, lr 2e-3, WSD: 50 warmup steps, the last 300 decaying,
`STEPS` = 1500 steps):
  g25_n20k_3L96   G_{2,5},  20k graphs, 3L/4H/96d  (the README's setting; chance 1/2)
  g25_n100k_4L128 G_{2,5}, 100k graphs, 4L/4H/128d (more data and a wider, deeper trunk)
  g35_n20k_3L96   G_{3,5},  20k graphs, 3L/4H/96d  (degree 3: chance 1/3)
Arms (`ARMS`): `gpt` (configs/nextlat.py:gpt_path_star), `nextlat` (the paper's losses
λ_h = 1, λ_KL = 1, dynamics MLP hidden 384, d = 2, with the latent h read before the final norm,
`latent="residual"`: at λ_h = 1 the final-normed reading collapses the trunk, see below), `mtp`
(d = 2 heads). Seed 0 runs every setting and arm, plus `nextlat_fn` (the same losses with the
final-normed latent, the paper's likeliest reading) at the smallest setting, for the collapse
curve beside the working one; seeds 1 and 2 run gpt, nextlat and mtp at `FINAL` only (change it
to the setting seed 0 separates: done cells keep their ids and are not rerun). 9 + 1 + 6 = 16
cells.

The evidence behind `latent="residual"` (400 steps of G_{2,5} 3L/96d at λ_h = 1, this session):
the final-normed latent's CE stays at ≈ 3.86 (≈ ln 48) with first-decision accuracy ≈ 1% (below
the 1/2 chance: the trunk does not even name a neighbour), while the residual latent's CE falls
below 2 by step 175 (README "NextLat and MTP" has the figures).

Curves: checkpoints every 100 steps, all kept; `python -m nsl.evals.planning --workdir=CELL
--all_checkpoints --limit=500` scores each (first-decision accuracy, exact match) beside the
L_next-h, L_KL and CE logged at that step (WORKDIR/planning_curve.json).

Cost, measured here on a machine shared at load ≈ 9-10 (2 cores): nextlat 0.63 s/step at
g25_n20k_3L96 and 0.88 at g25_n100k_4L128; gpt 0.65 at load ≈ 9 and 0.17 in a quieter minute
(11.8k tokens/s). On 2 quiet cores (about half the loaded figures; mtp between gpt and nextlat,
G_{3,5} ×1.4 for its 44 tokens per problem) that is per 1500-step cell ≈ 5 / 8 / 6 min (gpt /
nextlat / mtp) at g25_n20k_3L96, ≈ 7 / 11 / 8 at g25_n100k_4L128 and g35_n20k_3L96: seed 0
≈ 80 min with nextlat_fn, seeds 1-2 ≈ 40 at g25_n20k_3L96 (≈ 52 if FINAL is a larger rung),
≈ 2 CPU hours in all, every model well under 25 minutes.

  python -m nsl.scaling.grid run --grid=configs/grids/path_star_cpu.py --root=runs/path_star_cpu
  for d in runs/path_star_cpu/*/; do python -m nsl.evals.planning --workdir=$d --all_checkpoints --limit=500; done
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
