"""LIFT on text (docs/papers/lift.md#pretraining, issue #15): LIFT with a standard teacher trained
4x longer, against a standard transformer at matched tokens, with the paper's ablations.

All cells: the default corpus (SOTU, BPE-4096), 4 layers, d = 128, 4 heads, SwiGLU 384,
128-token sequences, 16 per step, lr 3e-3, WSD (20 warmup, final 15% decay).
  seed0-teacher_4x  configs/tiny.py trained 1,600 steps (3.3M tokens, 4x a student's), seed 0:
                    the frozen teacher of every student (the paper: same size, 10x Chinchilla)
  per seed 0, 1, 400 steps (819k tokens) each:
  standard          the plain transformer (configs/tiny.py)
  lift              LIFT (configs/lift.py:lift_tiny, top-k 1024 and τ 1.5 as in the paper,
                    state dropout 0.1, self-state adaptation over the last 10%, seeded with b)
                    on the teacher's states, computed on the fly
  lift_no_states    the same parameters with the channel off (b fed everywhere), CE only
  distill           no channel: CE + λ·KL to the teacher's states

Validation NLL (result.json eval.val) is the own-state NLL for LIFT runs (the paper's metric:
its own states fed back token by token with its KV cache) and the plain NLL for the rest; score
the other feeds with `python -m nsl.evals.nll --workdir=RUN --feed=teacher|bias`. The scale and
the 4x teacher are ours (the paper: 135M–1B parameters, 5x Chinchilla tokens).

  python -m nsl.scaling.grid run --grid=configs/grids/lift_text.py --root=runs/lift_text --parallel=2
  python -m nsl.scaling.study --root=runs/lift_text --baseline=arm=standard
"""

SEEDS = (0, 1)
STEPS = 400
TEACHER_FACTOR = 4

COMMON = {"model.d_model": 128, "model.n_heads": 4, "model.d_ff": 384, "model.n_layers": 4,
          "data.seq_len": 128, "train.batch_size": 16, "train.steps": STEPS, "train.warmup_steps": 20,
          "train.decay_steps": 60, "train.eval_every": 100, "train.eval_batches": 16, "train.log_every": 25,
          "checkpoint.every": 200, "checkpoint.keep": 1}
TEACHER = "@cell:seed0-teacher_4x"


def _lift(label: str, variant: str, teacher: str) -> dict:
  return {"_label": label, "config": "configs/lift.py:lift_tiny", "model.variant": variant,
          "lift.teacher": teacher, "lift.top_k": 1024}


def get_grid():
  steps = TEACHER_FACTOR * STEPS
  teacher = {"_label": "teacher_4x", "config": "configs/tiny.py", "train.steps": steps,
             "train.decay_steps": round(0.15 * steps), "checkpoint.every": steps // 4}
  grids = [{"overrides": COMMON, "axes": {"seed": [{"_label": "seed0", "seed": 0}], "arm": [teacher]}}]
  for seed in SEEDS:
    arms = [{"_label": "standard", "config": "configs/tiny.py"}, _lift("lift", "lift", TEACHER),
            _lift("lift_no_states", "lift_no_states", "labels"), _lift("distill", "distill", TEACHER)]
    grids.append({"overrides": COMMON, "axes": {"seed": [{"_label": f"seed{seed}", "seed": seed}], "arm": arms}})
  return grids
