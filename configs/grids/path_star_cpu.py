"""The path-star planning study with the NextLat authors' model and recipe (issue #45): GPT
and NextLat on G_{5,5}, 3 seeds each (MTP seed 0 only), at the largest trunk one cell can train within
90 CPU-minutes. All 7 cells have run (docs/papers/nextlat.md#rerun-authors: none learns to follow
an edge within 1.02M sequences at this size, on any seed).

The question (docs/papers/nextlat.md#tasks): next-token GPT settles in the Clever-Hans shortcut
(first decision after the start node right 1/d = 20% of the time, every later edge followed)
while NextLat learns to plan. The paper (12L/6H/384d, batch 512, 20k steps = 10.2M sequences):
NextLat ≈ 100% on G_{5,5}, GPT fails; third-party runs of the authors' code cross into the
solving regime after 0.5-1.5M sequences on G_{5,5}, and land in the shortcut basin on some seeds.

Cells: `ARMS` × `SEEDS` (seed = data order and initialisation), every one on
  data   G_{5,5}, 200k training and 20k test graphs (the paper's sets), 68 input tokens a row
  model  `MODEL` on the authors' trunk (configs/nextlat.py:path_star_model: untied head, N(0, 0.02)
         everywhere, SwiGLU 128·round(8d/3/128)); NextLat's p_ψ width 128·round(d/128) (their
         proj_factor 0.5, the paper's 384 at 384d), rollout d = ℓ − 2 = 3, λ_h = λ_KL = 1;
         MTP d = 3 heads
  recipe configs/nextlat.py:path_star_recipe: batch 512, LR 5e-4 constant from step 1, AdamW
         (0.9, 0.95), weight decay 0.1 on every matrix, clipping at 100; `STEPS` steps
`MODEL` and `STEPS` from tools/xcheck/nextlat_cost.py (docs/xcheck/nextlat.md has the figures):
one NextLat step of 512 × 68 tokens at 2L/4H/64d costs ≈ `NEXTLAT_CPU_S_PER_STEP` CPU-seconds
(GPT and MTP less), so `STEPS` = 2,000 steps (1.02M sequences, the middle of the third-party
crossing range) stay under 90 CPU-minutes; a wider or deeper trunk would not reach 1M sequences.

Curves: a checkpoint every 100 steps, all kept; then

  python -m nsl.scaling.grid run --grid=configs/grids/path_star_cpu.py --root=runs/path_star_authors
  python -m nsl.evals.planning_study --root=runs/path_star_authors --limit=1000

scores every checkpoint (first decision and exact match, greedy) against sequences seen; add
`--temperature=1` for the paper's protocol (sampled answers) and `--unfinished` to read cells still
training. Run order: seed 0 of every arm first, so an interrupted study still has one full
comparison.
"""

from configs import base
from configs import nextlat as nextlat_configs

SEEDS = (0, 1, 2)
ARMS = ("gpt", "nextlat", "mtp")
# MTP runs at seed 0 only: the issue makes it optional, and its two more seeds (≈ 2 × 45 CPU-minutes)
# go to GPT and NextLat, the comparison the paper's claim is about.
SEED0_ONLY = ("mtp",)
D, L, N_TRAIN, N_TEST = 5, 5, 200_000, 20_000
MODEL = (2, 4, 64)  # layers, heads, width
STEPS = 2_000  # × 512 = 1.02M sequences
NEXTLAT_CPU_S_PER_STEP = 2.68  # measured median (load 24-30 on 2 cores), docs/xcheck/nextlat.md


def setting() -> dict:
  """The task data and the trunk as grid fields (the arms' configs supply the recipe)."""
  from nsl.models.latent_spec import authors_d_ff

  c = nextlat_configs.path_star_data(base.get_config(), d=D, l=L, n_train=N_TRAIN, n_test=N_TEST)
  layers, heads, width = MODEL
  return {"_label": f"g{D}{L}_{layers}L{width}", "data.sources": tuple(c.data.sources), "data.path": c.data.path,
          "data.seq_len": c.data.seq_len, "model.n_layers": layers, "model.n_heads": heads, "model.d_model": width,
          "model.d_ff": authors_d_ff(width)}


def arm(name: str) -> dict:
  from nsl.models.latent_spec import authors_hidden

  cell = {"_label": name, "config": f"configs/nextlat.py:{name}_path_star"}
  if name == "nextlat":
    cell["nextlat.hidden"] = authors_hidden(MODEL[2])
  return cell


def get_grid():
  common = {"train.steps": STEPS, "train.log_every": 25, "train.eval_every": 500, "train.eval_batches": 4,
            "checkpoint.every": 100, "checkpoint.keep": STEPS // 100}
  return [{"overrides": common, "axes": {"seed": [seed], "size": [setting()], "config": [arm(a) for a in ARMS if seed == 0 or a not in SEED0_ONLY]}}
          for seed in SEEDS]
