"""Window ablation at size S (docs/papers/sps.md#results): w ∈ {0, 16, 64, 256} × {SPS, delayed state,
reverse SPS}, plus the standard transformer once, all at the paper's recipe (20B tokens,
4096-token sequences, batch 96): 13 runs.

In family "sps", `model.window` is the temporary-key window; the standard transformer has no
temporary keys, so it is one cell (`configs/sps.py:standard_s`, the same experiment — and run id — as
the standard S cell of configs/grids/sps_ladder.py), not four identical ones.

  python -m nsl.scaling.grid run --grid=configs/grids/sps_window.py --root=runs/sps_window
"""

WINDOWS = [0, 16, 64, 256]
VARIANTS = ["sps", "delayed_state", "reverse_sps"]


def get_grid():
  return [
      {"base": "configs/sps.py:sps_s", "axes": {"model.variant": VARIANTS, "model.window": WINDOWS}},
      {"axes": {"config": ["configs/sps.py:standard_s"]}},
  ]
