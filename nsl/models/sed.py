"""SED: the span-corruption encoder-decoder baseline of the double-decoder paper
(docs/papers/double_decoder.md#baselines).

Each packed row of `seq_len` tokens is span-corrupted on the fly from the step's rng
(`nsl.data.span_corruption`: noise density 0.15, mean span 4, 100 sentinels at the top of the
vocabulary; static shapes, so batches never recompile). A bidirectional encoder (the shared
`layers.Stack` with a non-causal, same-document rule) reads the corrupted row; a causal decoder
over the targets (pre-RMSNorm self attention, cross attention to the encoder output, the trunk's
MLP) with the tied head predicts them. Loss: CE over the targets (padding excluded). RoPE in the
encoder and in decoder self attention (each in its own compacted positions), and on cross
attention as the authors do it (queries at decoder positions, keys at encoder positions;
`sed.cross_rope=False` for none). The trunk options (`model.mlp`, `final_norm`, `init`,
`document_mask`; nsl/nn/layers.py) apply to encoder and decoder alike.

Layers: `model.n_layers` total, `sed.gen_layers` of them in the decoder (2:1 like the double
decoder's split). μP (`model.mup_base_width`; nsl/nn/mup.py): the cross-attention matrices
are hidden weights (init std / sqrt(m), Adam LR / m) and its queries get `Dims.query_scale`, so
every attention scores q·k/d_head.
FLOPs are counted per *original* token: the encoder sees (L - n + s)/L of them, the decoder
(n + s)/L, so SED's training FLOPs/token fall well below 6N.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from nsl.data import span_corruption
from nsl.errors import ConfigError, NslError
from nsl.nn import attention, cross_entropy, layers, masks
from nsl.models.family import Family, train_flops_per_token

ENCODER_RULE = masks.Rule(causal=False, same_segment=True)
DECODER_RULE = masks.Rule(causal=True, same_segment=True)
CROSS_RULE = masks.Rule(causal=False, same_segment=True)

TOKENIZER_VOCAB = {"gpt2": 50257, "byte": 257}


@dataclasses.dataclass(frozen=True)
class SEDSpec:
  """`config.sed` (nsl.schema): SED's options (docs/papers/double_decoder.md#baselines, T5's span
  corruption), checked in `SEDFamily.validate`."""

  noise_density: float = 0.15
  mean_span: float = 4.0
  sentinels: int = 100  # the top ids of the vocabulary
  gen_layers: int | None = None  # decoder layers; None or 0 = model.n_layers // 3
  cross_rope: bool = True  # RoPE on cross attention (the authors'); False: none

  def decoder_layers(self, n_layers: int) -> int:
    return self.gen_layers or n_layers // 3


class CrossAttention(nn.Module):
  """Decoder queries over encoder keys/values; with `rope`, queries rotated at decoder positions
  and keys at encoder positions (the authors' CrossAttention)."""

  dims: layers.Dims
  rope: bool = True

  @nn.compact
  def __call__(self, x_BTD, enc_BSD, q_slots, k_slots):
    d, h, hd, std = self.dims.d_model, self.dims.n_heads, self.dims.head_dim, self.dims.hidden_std
    ax = ("embed", "heads", "head_dim")
    wq = self.param("wq", layers.weight_init(self.dims, std, ax, (d, d)), (d, h, hd))
    wk, wv = (self.param(n, layers.weight_init(self.dims, std, ax, (d, 2 * d)), (d, h, hd)) for n in ("wk", "wv"))
    wo = self.param("wo", layers.weight_init(self.dims, std / (2 * self.dims.n_layers) ** 0.5,
                                             ("heads", "head_dim", "embed"), (d, d)), (h, hd, d))
    proj = lambda x, w: layers.dense(x, w)
    q, k = proj(x_BTD, wq), proj(enc_BSD, wk)
    if self.rope:
      q = layers.rope(q, q_slots.layout.tok, self.dims.rope_theta)
      k = layers.rope(k, k_slots.layout.tok, self.dims.rope_theta)
    if self.dims.query_scale is not None:  # μP attention scale (nsl/nn/mup.py)
      q = q * jnp.asarray(self.dims.query_scale, q.dtype)
    o = attention.attend(q, k, proj(enc_BSD, wv), CROSS_RULE, q_slots, k_slots,
                         impl=self.dims.attention_impl, chunk_q=self.dims.attention_chunk,
                         chunk_k=self.dims.attention_chunk)
    return layers.dense(o, wo, n_in=2)


class DecoderLayer(nn.Module):
  dims: layers.Dims
  cross_rope: bool = True

  @nn.compact
  def __call__(self, x, enc, q_slots, k_slots):
    eps = self.dims.norm_eps
    x = x + layers.Attention(self.dims, name="attn")(layers.RMSNorm(eps, name="attn_norm")(x), DECODER_RULE, q_slots)
    x = x + CrossAttention(self.dims, self.cross_rope, name="cross")(layers.RMSNorm(eps, name="cross_norm")(x), enc,
                                                                     q_slots, k_slots)
    x = x + layers.mlp(self.dims, name="mlp")(layers.RMSNorm(eps, name="mlp_norm")(x))
    return nn.with_logical_constraint(x, ("batch", "length", "act_embed"))


class EncoderDecoder(nn.Module):
  dims: layers.Dims
  enc_layers: int
  dec_layers: int
  cross_rope: bool = True

  @nn.compact
  def __call__(self, enc_tokens, enc_segment, dec_inputs, dec_segment):
    embed = layers.Embedder(self.dims, name="embed")
    enc_segment, dec_segment = (layers.attention_segment(self.dims, s) for s in (enc_segment, dec_segment))
    enc_slots = attention.Slots(masks.Layout.causal(enc_tokens.shape[1]), segment=enc_segment)
    dec_slots = attention.Slots(masks.Layout.causal(dec_inputs.shape[1]), segment=dec_segment)
    enc = layers.Stack(self.dims, ENCODER_RULE, n_layers=self.enc_layers, name="encoder")(
        embed.encode(enc_tokens), enc_slots)
    x = embed.encode(dec_inputs)
    for i in range(self.dec_layers):
      x = DecoderLayer(self.dims, self.cross_rope, name=f"dec_{i}")(x, enc, dec_slots, enc_slots)
    return embed.decode(layers.final_norm(self.dims, name="dec_norm")(x))


class SEDFamily(Family):
  name = "sed"
  no_decoder = "SED is a span-corruption encoder-decoder, with no left-to-right decoder"
  hf_refusal = ("SED is a span-corruption encoder-decoder with nsl's block masks; transformers' encoder-decoders "
                "(T5, BART) have other layers and masks")
  variants = ("sed",)
  init_len = 32

  options = SEDSpec
  # Where configs written before `config.sed` set these (nsl.options.upgrade).
  legacy = {"model.noise_density": "noise_density", "model.mean_span": "mean_span", "model.sentinels": "sentinels",
            "model.gen_layers": "gen_layers", "model.sed_cross_rope": "cross_rope"}

  @property
  def spec(self) -> SEDSpec:
    return self.options_of(self.config)

  @property
  def sentinels(self) -> int:
    return self.spec.sentinels

  @property
  def corruption(self) -> tuple[float, float]:
    return self.spec.noise_density, self.spec.mean_span

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    m, spec = config.model, cls.options_of(config)
    gen = spec.decoder_layers(m.n_layers)
    if not 1 <= gen < m.n_layers:
      raise ConfigError(f"config.sed.gen_layers={gen} (decoder layers) must be in [1, model.n_layers-1]")
    if not 0.0 < spec.noise_density < 1.0:
      raise ConfigError(f"config.sed.noise_density={spec.noise_density} must be in (0, 1)")
    if not spec.mean_span > 0.0:
      raise ConfigError(f"config.sed.mean_span={spec.mean_span} must be positive (mean tokens per noise span)")
    tok = config.data.tokenizer
    vocab = TOKENIZER_VOCAB.get(tok, config.data.tokenizer_vocab)
    need = vocab + spec.sentinels + 1
    if m.vocab_size < need:
      raise ConfigError(f"config.model.vocab_size={m.vocab_size} leaves no room for the {spec.sentinels} "
                        f"sentinels and the decoder-start id above the {tok} tokenizer's {vocab} ids; "
                        f"set it to at least {need}")
    n, s = span_corruption.counts(config.data.seq_len, spec.noise_density, spec.mean_span)
    if s > spec.sentinels:
      raise ConfigError(f"data.seq_len={config.data.seq_len} gives {s} noise spans, more than "
                        f"sed.sentinels={spec.sentinels}")

  def split(self) -> tuple[int, int]:
    gen = self.spec.decoder_layers(self.dims.n_layers)
    return self.dims.n_layers - gen, gen

  def make_model(self):
    return EncoderDecoder(self.dims, *self.split(), cross_rope=self.spec.cross_rope)

  def corrupt(self, batch, rng):
    tokens, segment = batch["tokens"][:, :-1], batch["segment"][:, :-1]
    density, span = self.corruption
    return span_corruption.corrupt_batch(rng, tokens, segment, self.dims.vocab_size, density, span, self.sentinels)

  def model_inputs(self, batch):
    c = self.corrupt(batch, jax.random.PRNGKey(0))
    return c["enc_tokens"], c["enc_segment"], c["dec_inputs"], c["dec_segment"]

  @property
  def rule(self) -> masks.Rule:
    """The decoder's self-attention rule (the encoder's is ENCODER_RULE, cross CROSS_RULE)."""
    return DECODER_RULE

  def with_rule(self, rule: masks.Rule):
    raise NslError("family 'sed' has fixed encoder, decoder and cross attention rules, no single rule to "
                   "replace; run this probe on a standard or SPS run")

  def token_logits(self, params, batch, *, model=None):
    """Next-token logits [B, T, V] from the decoder with each document one masked span
    (`Family.token_logits`; our reading of "as its decoder does"): the encoder sees only
    sentinel 0 at the document's first position, the decoder is teacher-forced on the
    document's tokens, so row t predicts token t + 1 from tokens <= t. No start id or sentinel
    precedes a document in the decoder (static shapes): a document scores the same wherever it
    sits in a packed row. SED's loss and eval score spans, not these logits."""
    inputs, _, seg_in, _ = cross_entropy.next_token_targets(batch)
    first = (seg_in > 0) & jnp.concatenate([jnp.ones_like(seg_in[:, :1], bool), seg_in[:, 1:] != seg_in[:, :-1]], 1)
    enc_tokens = jnp.where(first, self.dims.vocab_size - 1, 0).astype(inputs.dtype)  # sentinel 0
    enc_segment = jnp.where(first, seg_in, 0)
    return (model or self.model).apply({"params": params}, enc_tokens, enc_segment, inputs, seg_in)

  def loss(self, params, batch, rng, step):
    c = self.corrupt(batch, jax.random.fold_in(rng, 0x5ED))
    logits = self.model.apply({"params": params}, c["enc_tokens"], c["enc_segment"], c["dec_inputs"],
                              c["dec_segment"])
    weights = (c["dec_segment"] > 0).astype(jnp.float32)
    loss, weight = cross_entropy.masked_cross_entropy(logits, c["targets"], weights)
    return loss, {"weight": weight}

  def eval_nll(self, params, batch):
    """(sum, count) of the NLL per *original* token: the decoder's CE at its targets that are
    corrupted input tokens, sentinel targets (ids >= vocab_size - sentinels) left out, under the
    fixed evaluation corruption. This is the figure `eval_val_nll` reports for SED: nats per
    text token, the unit of the other families' next-token NLL (our reading; the double-decoder
    paper does not say how it scores SED). The training loss keeps the sentinels (T5)."""
    c = self.corrupt(batch, jax.random.fold_in(jax.random.PRNGKey(0), 0x5ED))
    logits = self.model.apply({"params": params}, c["enc_tokens"], c["enc_segment"], c["dec_inputs"],
                              c["dec_segment"])
    text = (c["dec_segment"] > 0) & (c["targets"] < self.dims.vocab_size - self.sentinels)
    loss, weight = cross_entropy.masked_cross_entropy(logits, c["targets"], text.astype(jnp.float32))
    return loss * weight, weight

  def flops_per_token(self) -> float:
    """Per original token: each weight costs 6 FLOPs per row position it is applied to (encoder
    weights and cross W_k/W_v at encoder length, the rest at target length), plus attention:
    bidirectional encoder Le², causal decoder Lt(Lt+1)/2, cross Lt·Le pairs per layer."""
    t, d = self.seq_len, self.dims.d_model
    density, span = self.corruption
    le, lt = span_corruption.lengths(t, density, span)
    enc_layers, dec_layers = self.split()
    tree = nn.unbox(self.abstract_params())
    matmul_rows = 0.0
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      names = [getattr(p, "key", "") for p in path]
      n = float(jnp.prod(jnp.asarray(leaf.shape)))
      at_encoder = names[0] == "encoder" or ("cross" in names and names[-1] in ("wk", "wv"))
      matmul_rows += n * (le if at_encoder else lt)
    pairs = enc_layers * le * le + dec_layers * (lt * (lt + 1) / 2 + lt * le)
    return train_flops_per_token(matmul_rows / t, pairs / t, 1, d)
