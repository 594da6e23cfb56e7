"""Seed spread for the CPU ladder (configs/grids/ladder_cpu.py): two of its cells again, both
arms, with seeds 1 and 2 (the ladder itself is seed 0; `seed` sets the data order and the
initialisation). Width 32 at 4.47M tokens (72 a parameter) and width 48 at 2.22M (17 a
parameter), the 2.1e12-FLOP IsoFLOP level: whether the SPS-standard gap at a few tens of tokens
a parameter is more than seed noise. 8 cells, about 18 CPU-minutes.

  python -m nsl.scaling.grid run --grid=configs/grids/ladder_cpu_seeds.py --root=runs/ladder_cpu_seeds --parallel=2
"""

from configs.grids import ladder_cpu as ladder

SEEDS = (1, 2)
LEVEL = 4  # the ladder's compute level C_TOP / 2^4 = 2.1e12 FLOPs
WIDTHS = (32, 48)


def cells() -> list[tuple[int, int]]:
  """(width, steps) of the ladder's cells repeated here."""
  level = ladder.c_top() / 2**LEVEL
  return [(d, steps) for c, d, steps in ladder.cells() if d in WIDTHS and abs(c / level - 1) < 1e-9]


def get_grid():
  return [{"base": "configs/tiny.py",
           "overrides": {**ladder.COMMON, "train.decay_steps": max(steps // 5, 10)},
           "axes": {"seed": list(SEEDS), "family": [ladder.FAMILIES[a] for a in ladder.ARMS],
                    "size": [ladder._size(d)], "tokens": [steps * ladder.TOKENS_PER_STEP]}}
          for d, steps in cells()]
