"""Countdown at CPU scale (REFERENCES §4 "Countdown", issue #17): GPT vs NextLat (d = 1).

Both cells are configs/nextlat.py's countdown setting (`countdown_data`: 50k training problems,
1,000 test problems whose targets are the 10% held out of training, 4L/4H/128d, batch 64, lr 1e-3,
the integer-per-token vocabulary of 10,048 rows, prompt loss-masked), seed 0, `STEPS` = 600
steps (WSD: 30 warmup steps, the last 120 decaying; 38.4k problems seen, under one epoch):
  gpt      configs/nextlat.py:gpt_countdown
  nextlat  configs/nextlat.py:nextlat_countdown: the paper's λ_h = 2, λ_KL = 1, d = 1 (MLP hidden
           256 at this width), the latent h read before the final norm (`latent="residual"`, as
           on path-star, where the final-normed h collapses the trunk at λ_h = 1)
The paper (12L/12H/768d, 500k problems): held-out-target accuracy GPT 33.1%, NextLat d = 1 54.8%.

Accuracy: `python -m nsl.evals.planning --workdir=CELL` (any correct solution counts);
`--all_checkpoints` gives the curve (checkpoints every 100 steps, all kept).

Cost: the 10k-row tied head dominates (NextLat ≈ 26 MFLOP per token with L_KL's two frozen-head
reads and their 10k-way softmaxes, GPT ≈ 13). Measured here at load ≈ 9-10 on 2 cores: nextlat
≈ 4.3 s/step, gpt 1.07 s/step; on 2 quiet cores about half: ≈ 22 min (nextlat) + 6 min (gpt).

  python -m nsl.scaling.grid run --grid=configs/grids/countdown_cpu.py --root=runs/countdown_cpu
  for d in runs/countdown_cpu/*/; do python -m nsl.evals.planning --workdir=$d; done
"""

SEEDS = (0,)
STEPS = 600
ARMS = ("gpt", "nextlat")


def get_grid():
  common = {"train.steps": STEPS, "train.warmup_steps": 30, "train.decay_steps": 120,
            "train.log_every": 25, "train.eval_every": 100, "train.eval_batches": 4,
            "checkpoint.every": 100, "checkpoint.keep": STEPS // 100 + 1}
  return [{"overrides": common,
           "axes": {"seed": [seed],
                    "config": [{"_label": a, "config": f"configs/nextlat.py:{a}_countdown"} for a in ARMS]}}
          for seed in SEEDS]
