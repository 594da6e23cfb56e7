"""The S5 pipeline of LIFT (docs/papers/lift.md#s5, issue #15) as one resumable grid, 3 seeds.

Per seed, in the order the runner starts them (a cell that names a teacher cell, "@cell:...",
waits until that cell is done; `nsl.scaling.grid`):
  standard_s5_8x   the bounded-depth teacher: the standard model trained 8x longer (3,200 steps)
  lift_rnn_s5      LIFT-RNN, its own states fed back sequentially in training
  lift_s5          LIFT trained in parallel on that seed's LIFT-RNN states (its own fed-back states)
  standard_s5      the standard 2-layer baseline (400 steps)
  lift_s5_oracle   LIFT on the oracle `labels` teacher: an upper bound, not the paper's LIFT
  lift_s5_bounded  LIFT on that seed's standard_s5_8x

Every model is configs/lift.py's (2 layers, d = 256, ≈2M parameters, 400 steps of 128 sequences;
the paper: 5,000 and 40,000 steps). CPU time per step, measured on 2 busy cores: ≈0.55 s
standard, ≈0.75 LIFT, so ≈4–5 CPU-minutes per 400-step model and ≈30 for standard_s5_8x. Wall
times of the 3-seed run (two runners, 4–6 processes on 2 cores, load 6–10): 400-step models
8–15 minutes each (LIFT-RNN's first, uninterrupted attempt 42), standard_s5_8x 56–127; the whole
grid's seeds 1–2 took 1.7 hours of such a machine (seed 0, in an earlier session, longer).

  python -m nsl.scaling.grid run --grid=configs/grids/s5.py --root=runs/s5 --parallel=2
  python -m nsl.evals.length_generalization --root=runs/s5   # scores done cells once, groups seeds
"""

SEEDS = (0, 1, 2)


def _arm(name: str, teacher: str | None = None) -> dict:
  arm = {"_label": name, "config": f"configs/lift.py:{name}"}
  if teacher:
    arm["lift.teacher"] = teacher
  return arm


def get_grid():
  grids = []
  for seed in SEEDS:
    s = f"seed{seed}"
    arms = [_arm("standard_s5_8x"), _arm("lift_rnn_s5"), _arm("lift_s5", teacher=f"@cell:{s}-lift_rnn_s5"),
            _arm("standard_s5"), _arm("lift_s5_oracle"), _arm("lift_s5_bounded", teacher=f"@cell:{s}-standard_s5_8x")]
    grids.append({"axes": {"seed": [{"_label": s, "seed": seed}], "arm": arms}})
  return grids
