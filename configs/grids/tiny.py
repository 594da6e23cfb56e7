"""The CPU-sized scaling grid: 2 families x 3 sizes x 3 token budgets = 18 runs, minutes on 2 cores.

Standard transformer vs SPS (w = 16 tokens) on the embedded SOTU corpus at the byte level, 2-layer
models of width 32 / 48 / 64 (35k-125k parameters), 64-token sequences, 16 per step. The budgets
are 32 / 64 / 128 steps (33k-131k tokens); the WSD schedule warms up for 8 steps and decays over
the last 16, so every budget ends with a decay as the paper's runs do. A cell takes 15-40 s here. Run, fit and plot it with:

  python -m nsl.scaling.grid run --grid=configs/grids/tiny.py --root=runs/grid_tiny
  python -m nsl.scaling.fit --root=runs/grid_tiny && python -m nsl.scaling.plot --root=runs/grid_tiny
"""


def _size(d: int) -> dict:
  return {"_label": f"d{d}", "model.d_model": d, "model.n_heads": 2, "model.d_ff": 3 * d}


def get_grid():
  tokens_per_step = 16 * 64
  return {
      "base": "configs/tiny.py",
      "overrides": {
          "data.path": "data/sotu-byte", "data.sources": ("sotu",), "data.tokenizer": "byte",
          "model.vocab_size": 257, "model.n_layers": 2, "data.seq_len": 64, "train.batch_size": 16,
          "train.lr": 3e-3, "train.warmup_steps": 8, "train.decay_steps": 16, "train.log_every": 16,
          "train.eval_every": 1_000_000, "train.eval_batches": 16, "checkpoint.every": 32,
          "checkpoint.async_save": False, "model.attention_chunk": 64,
      },
      "axes": {
          "family": [{"_label": "standard", "family": "standard", "model.variant": "standard", "model.window": None},
                     # SPS's tied <predict> row needs one id past the 257 bytes (sps.predict_token_id_of)
                     {"_label": "sps", "family": "sps", "model.variant": "sps", "model.window": 16,
                      "model.vocab_size": 264}],
          "size": [_size(32), _size(48), _size(64)],
          "tokens": [32 * tokens_per_step, 64 * tokens_per_step, 128 * tokens_per_step],
      },
  }
