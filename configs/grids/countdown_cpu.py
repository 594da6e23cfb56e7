"""Countdown at CPU scale (docs/papers/nextlat.md#tasks, issue #17): GPT vs NextLat (d = 1).

Both cells are configs/nextlat.py's countdown setting (`countdown_data`: 50k training problems,
1,000 test problems whose targets are the 10% held out of training, 4L/4H/128d on the authors'
trunk, batch 64, lr 1e-3, the integer-per-token vocabulary of 10,048 rows, prompt loss-masked),
seed 0, `STEPS` = 600
steps (WSD: 30 warmup steps, the last 120 decaying; 38.4k problems seen, under one epoch):
  gpt      configs/nextlat.py:gpt_countdown
  nextlat  configs/nextlat.py:nextlat_countdown: the paper's λ_h = 2, λ_KL = 1, d = 1 (MLP hidden
           128 at this width: the authors' proj_factor 0.5), the authors' model (final-normed h,
           untied head, L_KL through the trunk; docs/xcheck/nextlat.md)
The paper (12L/12H/768d, 500k problems): held-out-target accuracy GPT 33.1%, NextLat d = 1 54.8%.

Accuracy: `python -m nsl.evals.planning --workdir=CELL` (any correct solution counts);
`--all_checkpoints` gives the curve (checkpoints every 100 steps, all kept).

Cost: the 10k-row head dominates (NextLat: L_KL's two frozen-head reads and their 10k-way
softmaxes). Measured with nsl's earlier NextLat (tied head, a second rollout for L_KL) at load
≈ 9-10 on 2 cores: nextlat ≈ 4.3 s/step, gpt 1.07 s/step; the authors' model drops the second
rollout and adds an untied head's product (≈ 21 MFLOP per token vs GPT's 13). Run with the
authors' model (2026-12-05, load ≈ 3): gpt 6.1 CPU-minutes (0.61 s/step), nextlat 10.7 (1.07 s/step);
results on docs/papers/nextlat.md#countdown.

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
