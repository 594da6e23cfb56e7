"""The decoder protocol: what a family decodes with (docs/guide/decoding.md#generate).

`Family.decoder()` returns a `Decoder`, or None when the family has no left-to-right decoder
(SED: a span-corruption encoder-decoder). Everything that generates asks only this object:
`nsl.generate` (token by token through `prefill` and `step`, or the whole-loop `generate`),
lm-eval's model, planning, self-speculative decoding (`speculative`) and `nsl.bench.decode`.
A family that decodes with the shared KV cache (`trunk_decoder`), its own cache (the
double decoder's `nsl.models.dd_decode.decoder`) or one compiled loop (LIFT's own-state
feedback) fills in the parts it has; no caller asks which family it holds.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from nsl import decode
from nsl.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Decoder:
  """A family's decoder.

  generate(params, prompt [B, N], new_tokens, *, temperature=0., rng=None) -> (tokens [B, new]
    int32, logits [B, new, V]): the compiled whole loop, logits[:, k] the distribution token k was
    drawn from (greedy at temperature 0).
  prefill(params, prompt [B, N], new_tokens) -> (logits [B, V] of the first new token, state);
  step(params, state, token [B], k) -> (logits [B, V] of new token k + 1, state), `token` new
    token k: the token-at-a-time form (None: the family decodes only as one compiled loop).
  speculative(params, draft_len, temperature) -> an `nsl.models.nextlat_decode.Decoder` (None: the family
    has no draft model; docs/papers/nextlat.md#speculative-decoding).
  bench: "module:function" of the family's own `nsl.bench.decode` comparison, (config, args) ->
    exit status, printing its JSON rows (the SPS variants side by side, the double decoder beside
    a decoder-only model, LIFT beside its trunk without states); None: none. A name, not a
    function: the benchmarks sit above the families and are imported only when run.
  """

  generate: Callable[..., Any]
  prefill: Callable[..., Any] | None = None
  step: Callable[..., Any] | None = None
  speculative: Callable[..., Any] | None = None
  bench: str | None = None

  @property
  def streams(self) -> bool:
    """Whether it decodes a token at a time (`prefill`, `step`), so each token can be shown as it comes."""
    return self.prefill is not None and self.step is not None


def require(family, what: str = "generation") -> Decoder:
  """`family.decoder()`, or a one-line ConfigError naming the family when it has none."""
  decoder = family.decoder()
  if decoder is None:
    raise ConfigError(f"{what} needs a left-to-right decoder, and family {family.name!r} has none: "
                      f"{family.no_decoder} (docs/guide/decoding.md#generate)")
  return decoder


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def _token_step(dims, plan, lp, cache, token_B, index):
  return decode.decode_step(dims, plan, lp, cache, token_B, index)


def trunk_decoder(family):
  """The `Decoder` of a family whose model is the standard trunk under its
  `slot_plan()` (standard, SPS, NextLat, MTP): `nsl.decode.generate`, and prefill / step a token at a
  time in the token loop's form (`nsl.decode.decode_loop`: per-layer weights and K/V, made once)."""
  dims, plan = family.dims, family.slot_plan()

  def prefill(params, prompt_BN, new_tokens: int):
    n = prompt_BN.shape[1]
    logits, cache = decode.prefill_jit(dims, plan, params, jnp.asarray(prompt_BN, jnp.int32), n + new_tokens)
    lp = jax.jit(decode.token_loop_params, static_argnums=0)(dims, params)
    return logits, (lp, cache.per_layer(), n)

  def step(params, state, token_B, k: int):
    del params  # the token loop reads `lp`, made from them at prefill
    lp, cache, n = state
    logits, cache = _token_step(dims, plan, lp, cache, token_B, jnp.int32(n + k))
    return logits, (lp, cache, n)

  return Decoder(generate=functools.partial(decode.generate, family), prefill=prefill, step=step)
