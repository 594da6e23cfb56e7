"""The SPS paper's grid (docs/papers/sps.md#ladder): sizes XS..XL x {standard, 2x memory, delayed state, SPS}
at 20B tokens, and the standard transformer also at 40B: 25 runs.

Each cell is the family's own config (configs/sps.py:<variant>_<size>: the paper's recipe, GPT-2
tokenizer, 4096-token sequences, 96 per step) with `train.steps` set from the token budget
(20B / (96 x 4096) = 50,863 steps). The warmup (50M / 100M tokens) and the final 2B-token decay
are fixed token counts in the recipe, so the 40B runs decay over their last 2B tokens too.

  python -m nsl.scaling.grid run --grid=configs/grids/sps_ladder.py --root=runs/sps_ladder --backend=tpu
"""

SIZES = ("xs", "s", "m", "l", "xl")
VARIANTS = ("standard", "twox_memory", "delayed_state", "sps")


def get_grid():
  return [
      {"axes": {"config": [f"configs/sps.py:{v}_{s}" for s in SIZES for v in VARIANTS], "tokens": [20e9]}},
      {"axes": {"config": [f"configs/sps.py:standard_{s}" for s in SIZES], "tokens": [40e9]}},
  ]
