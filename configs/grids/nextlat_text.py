"""NextLat on text (issue #17): the model the self-speculative decoding sweep runs on, and its
GPT twin for the next-token loss beside it.

Both cells are the demo's setting (configs/tiny.py: 4L/4H/192d, the embedded default corpus,
batch 32 × 128 tokens, 300 steps = 1.2M tokens) as family `nextlat`:
  nextlat  configs/nextlat.py:nextlat_tiny: λ_h = λ_KL = 1, d = 2, dynamics MLP hidden 2·d_model,
           the default latent reading (`final_norm`: the vector the tied head reads)
  gpt      the same trunk and records without the dynamics model (`model.variant=gpt`)
Seed 0; checkpoints every 100 steps.

  python -m nsl.scaling.grid run --grid=configs/grids/nextlat_text.py --root=runs/nextlat_text
  python -m nsl.bench.decode --config=configs/nextlat.py:nextlat_tiny \
      --workdir=runs/nextlat_text/seed0-nextlat-* --draft_lens=2,4,6,8
"""

SEEDS = (0,)
ARMS = {"nextlat": {}, "gpt": {"model.variant": "gpt"}}


def get_grid():
  return [{"overrides": {"checkpoint.keep": 4},
           "axes": {"seed": list(SEEDS),
                    "config": [{"_label": a, "config": "configs/nextlat.py:nextlat_tiny", **o} for a, o in ARMS.items()]}}]
