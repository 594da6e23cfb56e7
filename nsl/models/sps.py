"""The SPS family: state-prediction separation and its baselines (docs/papers/sps.md#definitions).

A sequence of T tokens becomes 2T slots: the token x_i and a learned `<predict>` vector ρ_i. By
default (`config.sps.predict_embedding = "tied"`, the SPS authors' model and the paper's "ρ id
50257") ρ is the row `predict_token_id` of the tied token embedding: an id of the vocabulary, so
also an output class of the tied head (its logit is trained down at every read-out) and
weight-decayed with the embedding matrix. `"separate"` keeps ρ as its own d-vector parameter
`predict_embedding` (not an output class, not decayed; nsl's earlier model, which learned
measurably slower on the cross-check, docs/papers/sps.md#layout). Both count as embedding parameters. Both slots of
pair i carry `tok = i` (also their RoPE position), `pos = 2i + j` (the interleaved slot index,
j = 0 for x and 1 for ρ; causality reads it), `segment` = the document id of token i, and a
`kind` fixed by the variant:

  variant         x slot       ρ slot       logits read from
  sps             persistent   temporary    ρ  (ρ_i predicts x_{i+1})
  twox_memory     persistent   persistent   ρ  (SPS with w ≥ T: every ρ stays)
  delayed_state   temporary    persistent   ρ
  reverse_sps     temporary    persistent   x  (x_i predicts x_{i+1})
  standard        an alias: the standard family (`transformer.StandardFamily`, no window), so
                  a grid crosses it with the SPS variants; this module holds only what SPS adds

The rule is `masks.Rule(causal=True, same_segment=True, window=w)`: persistent keys are always
visible, temporary keys iff `tok(q) - tok(k) <= w` (`config.model.window`). Because the rule
reads metadata, the physical order of slots is free (`config.sps.layout`):
`interleaved` = [x1, ρ1, x2, ρ2, …]; `stream_major` = [x1..xT | ρ1..ρT], whose temporary half
of the key space is a band that the chunked/kernel paths skip tile by tile.

Window conventions (checked by `SPSFamily.validate`): sps, delayed_state and reverse_sps need
an integer w ≥ 0; twox_memory takes `window=None` (or any w ≥ seq_len, which is the same mask);
for `standard` the window has no effect — it has no temporary keys — so a window grid can cross
it with every w (use family "standard" for a sliding-window baseline; `SPSFamily.create`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from nsl.errors import ConfigError
from nsl.nn import attention, layers, masks
from nsl.models.family import NextTokenFamily, train_flops_per_token

VARIANTS = ("sps", "twox_memory", "delayed_state", "reverse_sps", "standard")
SLOT_VARIANTS = VARIANTS[:4]
# Variants that are another family: `SPSFamily.create` builds it from the config (`alias_config`).
ALIASES = {"standard": "standard"}
LAYOUTS = masks.ORDERS  # physical slot orders, `masks.Layout.grouped`
# Default physical layout (`config.sps.layout`), measured on CPU (2 cores, 4 layers,
# d 256, 4 heads, batch 8, w 64, docs/papers/sps.md#layout). With the CPU attention kernel
# (64-tiles), attention forward + backward per layer at 2048 slots (1024 tokens) 0.37 s stream-major
# vs 0.61 s interleaved (the temporary keys' band leaves whole tiles empty), at 512 slots 0.043 vs
# 0.042 s; train steps (tok/s, 2026-12-04) at 1024 tokens 876/697/593 vs 694/614/643 (compare.py's
# three rounds), at 256 and 512 within noise in alternating runs (753/775 vs 684/761; 716/874 vs
# 760/738); on an AVX-512 host (compare.py's three rounds, 18:08-18:29) at 1024 tokens
# 1,534/1,382/1,431 vs 1,374/1,311/1,368, at 256 1,612/1,668/1,622 vs 1,588/1,586/1,636. No length
# favours interleaved, so one default, no threshold.
DEFAULT_LAYOUT = "stream_major"

P, T_ = masks.PERSISTENT, masks.TEMPORARY

# `config.sps.predict_embedding`: how ρ is parameterised (module docstring). Default "tied".
PREDICT_EMBEDDINGS = ("tied", "separate")
DEFAULT_PREDICT_EMBEDDING = "tied"
# Ids of the fixed-size tokenizers; bpe reads `config.data.tokenizer_vocab` (same table as SED's).
TOKENIZER_VOCAB = {"gpt2": 50257, "byte": 257}


@dataclasses.dataclass(frozen=True)
class VariantSpec:
  """Kinds of the (x, ρ) slots of a pair and which of them is read out (0 = x, 1 = ρ)."""

  kinds: tuple[int, int]
  readout: int

  @property
  def has_temporary(self) -> bool:
    return T_ in self.kinds


SPECS: dict[str, VariantSpec] = {
    "sps": VariantSpec((P, T_), 1),
    "twox_memory": VariantSpec((P, P), 1),
    "delayed_state": VariantSpec((T_, P), 1),
    "reverse_sps": VariantSpec((T_, P), 0),
}


def _check_variant(variant: str) -> None:
  if variant not in SLOT_VARIANTS:
    raise ValueError(f"unknown SPS slot variant {variant!r}; choose one of {SLOT_VARIANTS}")


def slot_layout(variant: str, num_tokens: int, layout: str = "interleaved") -> masks.Layout:
  """Static per-slot metadata (pos, tok, kind) of 2T slots in the physical `layout` order: the
  (x_i, ρ_i) groups of `masks.Layout.grouped` with the variant's kinds."""
  _check_variant(variant)
  return masks.Layout.grouped(SPECS[variant].kinds, num_tokens, layout)


def slot_rule(variant: str, window: int | None, persistent_window: int | None = None) -> masks.Rule:
  """The attention rule of a variant: causal over slots, same document, windowed temporary keys."""
  _check_variant(variant)
  return masks.Rule(causal=True, same_segment=True, window=window, persistent_window=persistent_window)


def _check_window(variant: str, num_tokens: int, window: int | None) -> None:
  if variant == "twox_memory" and window is not None and window < num_tokens:
    raise ValueError(f"twox_memory is SPS with w >= T (every ρ persistent): window must be None or "
                     f">= num_tokens={num_tokens}, got {window}")


def slot_mask(variant: str, num_tokens: int, window: int | None, doc_ids=None,
              persistent_window: int | None = None) -> np.ndarray:
  """Boolean visibility [2T, 2T] in interleaved slot order (x1, ρ1, x2, ρ2, …): rows = query
  slots, columns = key slots. `doc_ids` [T] gives each token's (pair's) document (default one
  document); `window` None = unbounded."""
  _check_variant(variant)
  _check_window(variant, num_tokens, window)
  lay = slot_layout(variant, num_tokens, "interleaved")
  docs = np.ones(num_tokens, np.int32) if doc_ids is None else np.asarray(doc_ids, np.int32)
  if docs.shape != (num_tokens,):
    raise ValueError(f"doc_ids must have shape ({num_tokens},), got {docs.shape}")
  segment = np.repeat(docs, 2)
  rule = slot_rule(variant, window, persistent_window)
  mask = masks.dense_mask(rule, lay, lay, {"segment": segment}, {"segment": segment})
  return np.broadcast_to(mask, (lay.num_slots, lay.num_slots)).copy()


# ----------------------------------------------------------------------------- the model


class SPSLM(nn.Module):
  """tokens [B, T], segment [B, T] -> read-out logits [B, T, V] (row i predicts token i + 1).

  Submodule names match `transformer.LM` (`embed`, `trunk`) so both share one parameter tree
  apart from `predict_embedding`.
  """

  dims: layers.Dims
  rule: masks.Rule
  variant: str
  layout: str = "interleaved"
  # Row of the tied embedding that is ρ ("tied"); None = a separate `predict_embedding` vector.
  predict_token_id: int | None = None

  def setup(self):
    self.embedder = layers.Embedder(self.dims, name="embed")
    self.trunk = layers.Stack(self.dims, self.rule, name="trunk")
    if self.predict_token_id is None:
      init = nn.with_logical_partitioning(nn.initializers.normal(stddev=self.dims.init_std), ("embed",))
      self.predict_embedding = self.param("predict_embedding", init, (self.dims.d_model,))
    elif not 0 <= self.predict_token_id < self.dims.vocab_size:
      raise ValueError(f"predict_token_id={self.predict_token_id} is not a row of the {self.dims.vocab_size}-row "
                       "embedding")

  def rho(self):
    """The <predict> vector ρ [D] (a row of the tied embedding, or the separate parameter)."""
    if self.predict_token_id is None:
      return self.predict_embedding
    return self.embedder.embedding[self.predict_token_id]

  @property
  def spec(self) -> VariantSpec:
    return SPECS[self.variant]

  def to_slots(self, x_BTD, rho_BTD):
    """Two per-token streams -> [B, 2T, ...] in the physical layout."""
    if self.layout == "stream_major":
      return jnp.concatenate([x_BTD, rho_BTD], axis=1)
    b, t = x_BTD.shape[:2]
    return jnp.stack([x_BTD, rho_BTD], axis=2).reshape((b, 2 * t) + x_BTD.shape[2:])

  def from_slots(self, h_BSD, stream: int):
    """[B, 2T, ...] -> the `stream` (0 = x, 1 = ρ) slots [B, T, ...] in token order."""
    t = h_BSD.shape[1] // 2
    if self.layout == "stream_major":
      return h_BSD[:, stream * t:(stream + 1) * t]
    return h_BSD[:, stream::2]

  def hidden(self, tokens_BT, segment_BT):
    """Final-norm hidden states of all 2T slots, physical order."""
    t = tokens_BT.shape[1]
    x = self.embedder.encode(tokens_BT)
    rho = jnp.broadcast_to(self.rho().astype(x.dtype), x.shape)
    h = nn.with_logical_constraint(self.to_slots(x, rho), ("batch", "length", "act_embed"))
    slots = attention.Slots(slot_layout(self.variant, t, self.layout), segment=self.to_slots(segment_BT, segment_BT))
    return self.trunk(h, slots)

  def logits(self, h_BSD):
    return self.embedder.decode(self.from_slots(h_BSD, self.spec.readout))

  def __call__(self, tokens_BT, segment_BT):
    return self.logits(self.hidden(tokens_BT, segment_BT))

  def cross_entropy(self, tokens_BT, segment_BT, targets_BT, weights_BT):
    """`masked_cross_entropy` of `__call__`'s read-out logits, through `Embedder.cross_entropy`."""
    h_BTD = self.from_slots(self.hidden(tokens_BT, segment_BT), self.spec.readout)
    return self.embedder.cross_entropy(h_BTD, targets_BT, weights_BT)


@dataclasses.dataclass(frozen=True)
class SPSOptions:
  """`config.sps` (nsl.schema): how the slots are laid out and what ρ is (module docstring)."""

  layout: str = DEFAULT_LAYOUT  # LAYOUTS: the physical slot order
  predict_embedding: str = DEFAULT_PREDICT_EMBEDDING  # PREDICT_EMBEDDINGS: ρ a row of the tied embedding, or its own vector
  # The row that is ρ when tied; None = the first id past the tokenizer's (the authors' 50257 after GPT-2's ids).
  predict_token_id: int | None = None


# ----------------------------------------------------------------------------- the family


class SPSFamily(NextTokenFamily):
  """`config.family = "sps"`, `config.model.variant` in VARIANTS, `config.model.window` = w, and
  the options `config.sps` (`SPSOptions`)."""

  name = "sps"
  variants = VARIANTS
  embedding_params = ("embedding", "predict_embedding")
  hf_refusal = ("an SPS model reads each token out at a learned <predict> slot with its own attention rule "
                "(two slots per token); no transformers architecture has that layout")
  options = SPSOptions
  # Where configs written before `config.sps` set these (nsl.options.upgrade).
  legacy = {"model.layout": "layout", "model.predict_embedding": "predict_embedding",
            "model.predict_token_id": "predict_token_id"}
  legacy_if_set = ("predict_embedding", "predict_token_id")

  @property
  def variant(self) -> str:
    return self.config.model.variant

  @property
  def layout_name(self) -> str:
    return self.options_of(self.config).layout

  @classmethod
  def create(cls, config):
    """`Family.create`: the `standard` variant is the standard family (`ALIASES`, `alias_config`)."""
    if config.model.variant in ALIASES:
      from nsl.models import registry

      return registry.get_family(alias_config(config))
    return cls(config)

  @property
  def window(self) -> int | None:
    return None if self.variant == "twox_memory" else self.config.model.window

  @property
  def rule(self) -> masks.Rule:
    return slot_rule(self.variant, self.window)

  @property
  def predict_token_id(self) -> int | None:
    """The embedding row that is ρ, or None (a separate ρ vector)."""
    return predict_token_id_of(self.config)

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    m = config.model
    if m.variant in ALIASES:
      from nsl.models import registry

      return registry.get_family_class(ALIASES[m.variant]).validate(alias_config(config))
    o = cls.options_of(config)
    if o.layout not in LAYOUTS:
      raise ConfigError(f"config.sps.layout={o.layout!r} must be one of {LAYOUTS}")
    if m.variant in ("sps", "delayed_state", "reverse_sps") and m.window is None:
      raise ConfigError(f"config.model.window is None but variant {m.variant!r} needs the temporary-key "
                        "window w (an int >= 0, the paper uses 64); an unbounded window is variant "
                        "'twox_memory'")
    if m.variant == "twox_memory" and m.window is not None and m.window < config.data.seq_len:
      raise ConfigError(f"config.model.window={m.window} but variant 'twox_memory' is SPS with w >= T "
                        f"(every ρ stays persistent): set config.model.window=None, or use variant 'sps'")
    kind, rid = o.predict_embedding, o.predict_token_id
    if kind not in PREDICT_EMBEDDINGS:
      raise ConfigError(f"config.sps.predict_embedding={kind!r} must be one of {PREDICT_EMBEDDINGS}")
    if kind == "separate" and rid is not None:
      raise ConfigError(f"config.sps.predict_token_id={rid} has no effect with "
                        "config.sps.predict_embedding='separate' (ρ is its own vector): unset one of them")
    if kind == "tied":
      vocab = tokenizer_vocab(config)
      rid = predict_token_id_of(config)
      if not vocab <= rid < m.vocab_size:
        raise ConfigError(f"config.sps.predict_token_id={rid}: with config.sps.predict_embedding='tied' ρ is "
                          f"a row of the tied embedding that no token uses, so it must be in [{vocab}, "
                          f"model.vocab_size={m.vocab_size}) (the {config.data.tokenizer} tokenizer has {vocab} "
                          f"ids); raise config.model.vocab_size to at least {vocab + 1} (e.g. pad it to a "
                          f"multiple of 64), or set config.sps.predict_embedding='separate'")

  def slot_plan(self):
    """The decoder's token groups (docs/papers/sps.md#kv-cache): the variant's slot kinds and read-out slot
    (`SPECS`) in its prefill layout, ρ from `predict_vector`."""
    from nsl import decode

    spec = SPECS[self.variant]
    return decode.SlotPlan(kinds=spec.kinds, readout=spec.readout, rule=self.rule, layout=self.layout_name,
                           predict=predict_vector, predict_token_id=self.predict_token_id)

  def decoder(self):
    """The shared KV-cache decoder over `slot_plan()`, benchmarked with the other variants."""
    from nsl.models import transformer

    return dataclasses.replace(super().decoder(), bench=transformer.SLOT_VARIANTS_BENCH)

  def make_model(self) -> nn.Module:
    return SPSLM(self.dims, self.rule, self.variant, self.layout_name, self.predict_token_id)

  def layout(self, num_tokens: int) -> masks.Layout:
    """The 2T slots of the variant in `config.sps.layout` order."""
    return slot_layout(self.variant, num_tokens, self.layout_name)

  def init(self, rng) -> Any:
    """Parameters (boxed). Neither their shapes nor their values depend on the sequence length or
    the attention implementation, so the model is initialised on a short dummy row with the dense
    attention: the same parameters at a fraction of the tracing time (48 layers x 8192 slots)."""
    short = {k: v[:, :min(v.shape[1], 9)] for k, v in self.dummy_batch().items()}
    model = self.model.clone(dims=dataclasses.replace(self.dims, attention_impl="xla", remat="none"))
    return model.init(rng, *self.model_inputs(short))["params"]

  def abstract_params(self):
    """Parameter shapes depend only on the dimensions and on whether a separate ρ vector exists:
    shared by all SPS variants of a size (describe over a ladder traces each size once)."""
    return _abstract_params(self.dims, self.predict_token_id is not None, self)

  def flops_per_token(self) -> float:
    """Every slot pays the trunk matmuls, only read-out slots pay the head (tied embedding);
    attention counts the visible pairs of the static layout (one document)."""
    t = self.seq_len
    lay = slot_layout(self.variant, t, self.layout_name)
    pairs = masks.visible_pairs(self.rule, lay, lay)
    counts = self.param_counts()
    head = self.dims.vocab_size * self.dims.d_model
    slots_per_token = lay.num_slots // t
    body = counts["params_total"] - counts["params_embedding"]
    return train_flops_per_token(slots_per_token * body + head, pairs / t, self.dims.n_layers, self.dims.d_model)


_ABSTRACT: dict = {}  # (Dims, has no separate ρ) -> boxed ShapeDtypeStructs; a few entries per process


def _abstract_params(dims: layers.Dims, no_separate_rho: bool, family: "SPSFamily"):
  key = (dims, no_separate_rho)
  if key not in _ABSTRACT:
    _ABSTRACT[key] = jax.eval_shape(family.init, jax.random.PRNGKey(0))
  return _ABSTRACT[key]


def variant_config(base, variant: str, window: int | None, layout: str | None = None):
  """`base` as SPS `variant` (`nsl.bench.decode`'s side-by-side table): the window `window`, else
  the config's, else 64, for the variants with temporary keys; None for twox_memory and standard."""
  import copy

  c = copy.deepcopy(base)
  c.family = "sps"
  c.model.variant = variant
  if layout is not None:  # else the config's
    c.sps.layout = layout
  if variant in ALIASES or variant == "twox_memory":
    c.model.window = None
  else:
    c.model.window = window if window is not None else (base.model.window if base.model.window is not None else 64)
  return c


def alias_config(config):
  """The config of the family an aliased variant is (`ALIASES`): the standard family, whose
  `model.window` would be a sliding window over every key, so None (SPS's standard variant has
  no temporary keys for the window to bound)."""
  import copy

  c = copy.deepcopy(config)
  c.family = ALIASES[config.model.variant]
  c.model.window = None
  return c


def tokenizer_vocab(config) -> int:
  """Ids the config's tokenizer produces (gpt2, byte: fixed; bpe: `config.data.tokenizer_vocab`)."""
  return int(TOKENIZER_VOCAB.get(config.data.tokenizer, config.data.tokenizer_vocab))


def predict_token_id_of(config) -> int | None:
  """The embedding row that is ρ under `config.sps.predict_embedding="tied"` (the default):
  `config.sps.predict_token_id`, or when None the first id past the tokenizer's. None for "separate"."""
  o = SPSFamily.options_of(config)
  if o.predict_embedding == "separate":
    return None
  return tokenizer_vocab(config) if o.predict_token_id is None else o.predict_token_id


def predict_vector(params, predict_token_id: int | None):
  """ρ [D] from a parameter tree (unboxed): the embedding row, or `predict_embedding`."""
  if predict_token_id is None:
    return params["predict_embedding"]
  return params["embed"]["embedding"][predict_token_id]
