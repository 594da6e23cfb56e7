"""μP, the maximal update parametrisation (Yang et al. 2022, "Tensor Programs V"), for the
double decoder, SED and decoder-only: the double-decoder paper trains all three with μP at base
width 64 and tunes its LRs (DD 0.01, SED 0.004, decoder-only 0.01) at that base
(docs/papers/double_decoder.md#training).

`model.mup_base_width = B` turns it on (0 or None = off, standard parametrisation: the default
of every config, and the only choice for the other families). With the width multiplier
m = d_model / B, for Adam (TP5 Table 3; what the `mup` package's MuAdamW and Cerebras' and
EleutherAI's μP implementations do):

| parameters                                  | init std                   | Adam LR | forward          |
|---------------------------------------------|----------------------------|---------|------------------|
| hidden matrices (attention W_q W_k W_v W_o, | init_std / sqrt(m)         | lr / m  |                  |
| cross K/V, every MLP matrix)                | (∝ 1/sqrt(fan_in))         |         |                  |
| tied embedding (vector-like input)          | init_std (constant)        | lr      | logits × 1/√m    |
| norm gains and LayerNorm biases             | 1, 0                       | lr      |                  |
| attention scores                            |                            |         | q·k·√b / d_head  |

The forward multipliers are the double-decoder authors' (their code: `mup_readout_mult =
sqrt(base / d)`, attention scale `sqrt(base_head_dim) / head_dim`, docs/xcheck/dd.md); nsl's
earlier reading is kept as options: `model.mup_readout='linear'` (logits × 1/m, the `mup`
package's MuSharedReadout) and `model.mup_base_head_dim=1` (scores q·k/d_head). With
`model.init='xavier_uniform'` (the authors' init) the init column does not apply: xavier's
fans already shrink a hidden matrix's scale with width.

- **Init** (`layers.Dims.hidden_std`): the hidden matrices' std is init_std / sqrt(m), so it
  equals init_std at the base width; the GPT-2 depth factor 1/sqrt(2L) of the output projections
  is kept (a depth rule, not a width one).
- **Output multiplier** (`layers.Embedder.decode`, `layers.Dims.logit_scale`): the embedding is
  tied, so the same matrix is the input embedding (vector-like: LR and init constant) and the
  readout; the readout rule is applied as an "output multiplier" on the logits (1/√m, or 1/m)
  instead of giving the readout its own init and LR.
- **Attention** (`layers.Dims.query_scale`): scores q·k·√b/d_head with b =
  `model.mup_base_head_dim` (64: the standard scale at the paper's 64-wide heads), done by
  scaling the (RoPE-rotated) queries by √(b/d_head) before the shared attention path, which
  keeps its 1/sqrt(d_head); every attention of the three families (the trunk's,
  ComboAttention's self and cross halves, SED's cross attention, the cached decoders) goes
  through `layers.Attention.project_q` or applies the same factor.
- **Learning rates** (`scale_by_width`, chained after AdamW in `nsl.train.state`): the update of
  every hidden matrix is multiplied by 1/m. optax's AdamW multiplies its decoupled weight decay
  by the LR, so those matrices' decay is scaled with their LR, as with a per-group LR in
  PyTorch's AdamW (the `mup` package). The warmup/decay schedule is shared.

At the base width (m = 1), with b the base width's head size, the model is the standard one, so the
paper's base LRs apply there and, by μP, at every width. The coordinate check in
tests/models/test_mup.py shows activations flat across widths after 10 Adam steps with μP and
growing without it.
"""

from __future__ import annotations

import jax
import optax

from nsl.errors import ConfigError

# Families whose every parameter is classified below (the others have extra vectors or heads
# whose μP treatment nobody has decided: they refuse the field).
FAMILIES = ("standard", "double_decoder", "sed")
# Vector-like parameters (one dimension grows with width): Adam LR unscaled.
VECTOR_LIKE = ("embedding", "scale", "bias")
# Matrix-like (hidden) parameters (both dimensions grow with width): Adam LR / m.
HIDDEN = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "w_in", "w_out")


def base_width(config) -> int:
  """model.mup_base_width, 0 when μP is off (None or 0)."""
  value = config.model.mup_base_width
  return int(value) if value else 0


def width_mult(config) -> float | None:
  """m = d_model / base width, None when μP is off."""
  b = base_width(config)
  return config.model.d_model / b if b else None


def validate(config) -> None:
  """The one check of model.mup_base_width (called by nsl.config.validate)."""
  value = config.model.mup_base_width
  if value is None or (value == 0 and not isinstance(value, bool)):
    return
  if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= config.model.d_model:
    raise ConfigError(f"config.model.mup_base_width={value!r} must be a positive integer <= model.d_model="
                      f"{config.model.d_model} (the μP base width, 64 in the double-decoder paper), or 0 / None "
                      "for standard parametrisation")
  if config.family not in FAMILIES:
    raise ConfigError(f"config.model.mup_base_width={value} (μP) is implemented for the families {FAMILIES}, "
                      f"not {config.family!r}; set it to 0")


def _name(path) -> str:
  keys = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
  return str(keys[-1]) if keys else ""


def lr_multiplier(path, mult: float) -> float:
  """The Adam LR factor of the parameter at `path` (a pytree key path): 1/m for hidden matrices,
  1 for vector-like ones; an unknown name is an error, never a silent guess."""
  name = _name(path)
  if name in VECTOR_LIKE:
    return 1.0
  if name in HIDDEN:
    return 1.0 / mult
  raise ConfigError(f"μP: parameter {jax.tree_util.keystr(path)} is neither a hidden matrix {HIDDEN} nor "
                    f"vector-like {VECTOR_LIKE}; classify it in nsl/nn/mup.py")


def lr_multipliers(params, mult: float):
  """The per-parameter LR factors as a tree shaped like `params` (for inspection and tests)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: lr_multiplier(path, mult), params)


def scale_by_width(mult: float) -> optax.GradientTransformation:
  """Stateless: multiplies each parameter's update by its `lr_multiplier` (chained after AdamW)."""

  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda path, u: u * lr_multiplier(path, mult), updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)
