"""The CPU-sized scaling grid: 2 families x 3 sizes x 3 compute levels = 18 runs, minutes on 2 cores.

Standard transformer vs SPS (w = 16 tokens) on the embedded SOTU corpus at the byte level, 2-layer
models of width 32 / 48 / 64 (35k-124k parameters), 64-token sequences, 16 per step. The budgets
form IsoFLOP slices: at each of three compute levels (x2 apart) every size gets the tokens that
spend the same standard-transformer training FLOPs (16-215 steps, 16k-220k tokens), so all three
approaches of `nsl.scaling.fit` have something to read. SPS cells train on the same tokens as the
standard ones; at about 1.9x the FLOPs per token they form their own slices, 1.9x up the compute
axis. The WSD schedule warms up for 4 steps and decays over the last 8. A cell takes 10-40 s here.
Run (two cells at a time), fit and plot it with:

  python -m nsl.scaling.grid run --grid=configs/grids/tiny.py --root=runs/grid_tiny --parallel=2
  python -m nsl.scaling.fit runs/grid_tiny
  python -m nsl.scaling.plot --root=runs/grid_tiny

Nine points per family cannot identify a five-parameter law; the fit says so (docs/guide/scaling.md).
"""

TOKENS_PER_STEP = 16 * 64
# Standard-transformer training FLOPs per token at these widths (`nsl.launch --mode=describe` of a
# cell); only the slices' shape depends on them, so a change of FLOP convention does not break it.
FLOPS_PER_TOKEN = {32: 235_008, 48: 472_320, 64: 789_504}
LEVELS = (16, 32, 64)  # steps of the widest model at each compute level


def steps(d: int, level: int) -> int:
  """Steps that give width d the training FLOPs the widest model spends in `level` steps."""
  return round(level * FLOPS_PER_TOKEN[64] / FLOPS_PER_TOKEN[d])


def _size(d: int) -> dict:
  return {"_label": f"d{d}", "model.d_model": d, "model.n_heads": 2, "model.d_ff": 3 * d}


def get_grid():
  families = [{"_label": "standard", "family": "standard", "model.variant": "standard", "model.window": None},
              # SPS's tied <predict> row needs one id past the 257 bytes (sps.predict_token_id_of)
              {"_label": "sps", "family": "sps", "model.variant": "sps", "model.window": 16,
               "model.vocab_size": 264}]
  overrides = {
      "data.path": "data/sotu-byte", "data.sources": ("sotu",), "data.tokenizer": "byte",
      "model.vocab_size": 257, "model.n_layers": 2, "data.seq_len": 64, "train.batch_size": 16,
      "train.lr": 3e-3, "train.warmup_steps": 4, "train.decay_steps": 8, "train.log_every": 16,
      "train.eval_every": 1_000_000, "train.eval_batches": 16, "checkpoint.every": 64,
      "checkpoint.async_save": False, "model.attention_chunk": 64,
  }
  # One sub-grid per width (each with its own budgets), smallest first: a fit is possible early.
  return [{"base": "configs/tiny.py", "overrides": overrides,
           "axes": {"family": families, "size": [_size(d)],
                    "tokens": [steps(d, level) * TOKENS_PER_STEP for level in LEVELS]}}
          for d in (32, 48, 64)]
