"""The CPU-scale double-decoder study (docs/papers/double_decoder.md#cpu-scale, issues #14 and #45):
decoder-only, DD and SED at two widths, 2 seeds, with the authors' models (docs/xcheck/dd.md).

Every cell is the family's tiny config (configs/dd.py:{decoder_only,dd,sed}_tiny: 3 layers split
2:1 for DD and SED, SOTU BPE-4096, 128-token sequences, 16 per step; the authors' trunk: GELU MLP
of 4d, final LayerNorm, xavier-uniform init, no document masking; μP at base width 64 with their
multipliers (logits × 1/sqrt(m), attention q·k·sqrt(64)/d_head) and base LRs DD 0.01, SED 0.004,
decoder-only 0.01, weight decay 0.5) at d = 128 (2 heads) and d = 192 (3 heads: the paper's 6.25M
width, heads d/64), trained 400 steps (819k tokens) with the paper's schedule (5% warmup, linear
decay to 10% of the peak over the rest). Its first run (before the authors' models) is in git
history; the rerun with the authors' models is on docs/papers/double_decoder.md#cpu-scale (1.4-4.3
CPU-minutes a cell).

SED's validation NLL is per original token (`SEDFamily.eval_nll`: the decoder's CE at targets
that are corrupted text tokens, sentinels left out), so all three are nats per text token; SED
still sees bidirectional context, so its figure is not a left-to-right NLL. 12 cells; the budget
and widths are ours (the paper: 62.5M-1B tokens at 2048 per sequence, 6.25M-1B parameters).

  python -m nsl.scaling.grid run --grid=configs/grids/dd_cpu.py --root=runs/dd_cpu
  python -m nsl.scaling.study --root=runs/dd_cpu --baseline=config=decoder_only
"""

from configs import dd

SEEDS = (0, 1)
STEPS = 400
ARCHS = ("decoder_only", "dd", "sed")


def _width(d: int) -> dict:
  return {"_label": f"d{d}", "model.d_model": d, "model.n_heads": d // 64, "model.d_ff": 4 * d}  # GELU 4d


def get_grid():
  warmup = max(1, round(0.05 * STEPS))
  common = {"train.steps": STEPS, "train.warmup_steps": warmup, "train.decay_steps": STEPS - warmup,
            "train.schedule": "wsd", "train.min_lr_ratio": 0.1, "train.eval_every": 50,
            "train.eval_batches": 16, "train.log_every": 25, "checkpoint.every": 200, "checkpoint.keep": 1}
  return [{"overrides": common,
           "axes": {"seed": [seed], "size": [_width(128), _width(192)],
                    "config": [{"_label": a, "config": f"configs/dd.py:{a}_tiny"} for a in ARCHS]}}
          for seed in SEEDS]
