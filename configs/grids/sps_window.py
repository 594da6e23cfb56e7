"""Window ablation at size S (REFERENCES §1): w ∈ {0, 16, 64, 256} × {sps, delayed_state,
reverse_sps} plus standard, each at the paper's recipe (20B tokens, 4096-token sequences).

Format: `get_grid()` returns `{"base": config file, "axes": {dotted config field: values}}`; the
cells are the Cartesian product of the axes applied to the base config.

In family "sps", `model.window` is the *temporary-key* window; the standard variant has no
temporary keys, so its four cells are the same model (the paper's flat standard line). A runner
that wants to save the three duplicate S-size runs can skip cells whose variant is "standard"
and window is not the first value.
"""


def get_grid():
  return {
      "base": "configs/sps_s.py",
      "axes": {
          "model.variant": ["sps", "delayed_state", "reverse_sps", "standard"],
          "model.window": [0, 16, 64, 256],
      },
  }
