"""The double-decoder paper's grid (docs/papers/double_decoder.md#sizes): widths 6.25M..100M x token budgets
62.5M..1B x {double decoder, SED, decoder-only}: 5 x 5 x 3 = 75 runs.

Each cell is the family's config (configs/dd.py:{dd,sed,decoder_only}_{size}: sequence 2048,
64 sequences = 131,072 tokens per step) with the budget applied as train.steps plus the recipe's
schedule (5% warmup, linear decay to 10% over all remaining steps) recomputed for that length,
which a plain "tokens" axis would not do.

  python -m nsl.scaling.grid list --grid=configs/grids/dd_ladder.py
  python -m nsl.scaling.grid run  --grid=configs/grids/dd_ladder.py --root=runs/dd_ladder --backend=tpu
"""

SIZES = ("6m", "12m", "25m", "50m", "100m")
ARCHS = ("dd", "sed", "decoder_only")
BUDGETS = (62.5e6, 125e6, 250e6, 500e6, 1e9)
TOKENS_PER_STEP = 2048 * 64  # configs/dd.py SEQ_LEN x BATCH


def _label(tokens: float) -> str:
  return f"{tokens / 1e9:g}B" if tokens >= 1e9 else f"{tokens / 1e6:g}M"


def budget(tokens: float) -> dict:
  steps = int(round(tokens / TOKENS_PER_STEP))
  warmup = max(1, int(round(0.05 * steps)))
  return {"_label": _label(tokens), "train.steps": steps, "train.warmup_steps": warmup,
          "train.decay_steps": steps - warmup}


def get_grid():
  return {"axes": {"config": [f"configs/dd.py:{a}_{s}" for s in SIZES for a in ARCHS],
                   "budget": [budget(t) for t in BUDGETS]}}
