"""Block-based double decoder (docs/papers/double_decoder.md#definitions): a context decoder and a generation decoder.

- **Context decoder**: the shared causal trunk (`layers.Stack`: pre-RMSNorm, attention, MLP,
  final norm) over the packed row; its final output is the context latents `c`. In the paper's
  configs (configs/dd.py) the trunk is the authors' (docs/xcheck/dd.md): GELU MLP of 4d, a final
  LayerNorm, xavier-uniform init with gain sqrt(2), no document masking.
- **Generation decoder**: embeds the same raw tokens (tied embedding, no shift, no corruption);
  each layer is pre-RMSNorm -> `ComboAttention` -> GELU MLP (hidden 4d); a final norm (the
  trunk's kind: `layers.final_norm`) and the tied head give next-token logits at every position
  (the full next-token loss).
- **ComboAttention**: queries from the generation stream; self K/V from the generation stream
  under `SELF_RULE` (causal, same block, same document unless `model.document_mask` is off);
  cross K/V from the context latents under `CROSS_RULE` (key block < query block, plus the key
  at token 0 as a sink, same document likewise). RoPE with absolute token positions on queries and both key sets. The two
  attentions are merged exactly by log-sum-exp (`attention.merge_lse`), i.e. one softmax over
  the union of both key sets. "One shared projection" (the paper's default) is read here as:
  the cross K/V use the same per-layer W_k, W_v as the self K/V (`double_decoder.cross_kv='shared'`);
  `'separate'` gives the cross keys their own W_k, W_v per layer.
  `CROSS_RULE` also states `causal=True`: with contiguous, increasing block ids
  `block(k) < block(q)` and the token-0 sink both imply `pos(k) <= pos(q)`, so the visible set is
  the same as Rule(causal=False, block='earlier', sink=True) and the chunked path skips the
  upper-triangle tiles (tests check the equality against the definition).
- **Blocks**: boundaries are drawn per step from the step's rng, shared across the batch, and
  passed as the dynamic `block` ids [1, T] (`sample_blocks`, strategies `BLOCK_STRATEGIES` =
  the family's variants, as the authors' collator draws them).

Layer split: `model.n_layers` is the total; `double_decoder.gen_layers` of them form the generation
decoder (2:1 context:generation by default, e.g. 8+4). μP (`model.mup_base_width`, 64 in the
paper's configs; nsl/nn/mup.py): the cross K/V and GELU MLP matrices are hidden weights like
the trunk's (Adam LR / m); ComboAttention's queries come from `Attention.project_q`, so both
halves score with the same μP attention scale.
"""

from __future__ import annotations

import dataclasses
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from nsl.errors import ConfigError, NslError
from nsl.nn import attention, cross_entropy, kv_cache, layers, masks
from nsl.models import dd_decode
from nsl.models.family import Family, train_flops_per_token

CONTEXT_RULE = masks.Rule(causal=True, same_segment=True)
SELF_RULE = masks.Rule(causal=True, same_segment=True, block="same")
CROSS_RULE = masks.Rule(causal=True, same_segment=True, block="earlier", sink=True)

BLOCK_STRATEGIES = ("random_uniform", "logspace", "single_middle", "prompt_style")
MAX_BLOCKS = 8  # the authors' collator's max_blocks
MAX_BOUNDARIES = 8  # logspace draws up to 8 boundaries; random_uniform 2..7
# logspace's boundary counts: np.logspace(0, log10(8), 4).round() = 1, 2, 4, 8, each drawn with
# probability 1/4 and raised to at least 2 (the authors' collator), so 2 has probability 1/2.
LOGSPACE_COUNTS = (2, 2, 4, 8)


# ----------------------------------------------------------------------------- block sampling


def sample_blocks(rng, seq_len: int, strategy: str = "random_uniform", prompt_lengths=None):
  """Block ids [1, seq_len] int32 for one step, shared across the batch: the authors' collator
  (`DDPretrainCollator._sample_blocks`) with jax's rng.

  A boundary b starts a new block at position b; ids count the boundaries <= position.
  - `random_uniform` (default): 2..7 distinct boundaries uniform in [2, L-2];
  - `logspace`: a count from `LOGSPACE_COUNTS` (2 w.p. 1/2, 4 and 8 w.p. 1/4), distinct
    boundaries uniform in [2, L-2];
  - `single_middle`: one boundary at L//2 (two blocks, no randomness);
  - `prompt_style`: one boundary drawn from `prompt_lengths` (an SFT set's prompt lengths, one
    per prompt: a histogram by repetition), those in [2, L-2]; L//2 when none is.
  """
  lo, hi = 2, seq_len - 2
  if hi < lo + MAX_BOUNDARIES:
    raise ConfigError(f"data.seq_len={seq_len} is too short for block sampling (need >= {lo + MAX_BOUNDARIES + 3})")
  pos = jnp.arange(seq_len, dtype=jnp.int32)
  k_num, k_pos = jax.random.split(rng)
  if strategy == "single_middle":
    bounds, active = jnp.asarray([seq_len // 2], jnp.int32), jnp.asarray([True])
  elif strategy == "prompt_style":
    if prompt_lengths is None:
      raise ConfigError("block strategy 'prompt_style' needs double_decoder.prompt_lengths_file (a .npy of prompt lengths)")
    valid = np.asarray(prompt_lengths, np.int64)
    valid = valid[(valid >= lo) & (valid <= hi)]
    if valid.size == 0:
      bounds = jnp.asarray([seq_len // 2], jnp.int32)
    else:
      bounds = jax.random.choice(k_pos, jnp.asarray(valid, jnp.int32), (1,))
    active = jnp.asarray([True])
  elif strategy in ("random_uniform", "logspace"):
    if strategy == "random_uniform":
      n = jax.random.randint(k_num, (), 2, MAX_BLOCKS)  # the collator's integers(2, max_blocks)
    else:
      n = jax.random.choice(k_num, jnp.asarray(LOGSPACE_COUNTS, jnp.int32))
    bounds = lo + jax.random.choice(k_pos, hi - lo + 1, (MAX_BOUNDARIES,), replace=False)
    active = jnp.arange(MAX_BOUNDARIES) < n
  else:
    raise ConfigError(f"block strategy {strategy!r} is not one of {BLOCK_STRATEGIES}")
  ids = jnp.sum((pos[:, None] >= bounds[None, :]) & active[None, :], axis=1)
  return ids.astype(jnp.int32)[None, :]


# ----------------------------------------------------------------------------- layers


class CrossKV(nn.Module):
  """Separate cross K/V projections (only with double_decoder.cross_kv='separate')."""

  dims: layers.Dims

  def setup(self):
    d, h, hd = self.dims.d_model, self.dims.n_heads, self.dims.head_dim
    init = layers.weight_init(self.dims, self.dims.hidden_std, ("embed", "heads", "head_dim"), (d, 2 * d))
    self.wk = self.param("wk", init, (d, h, hd))
    self.wv = self.param("wv", init, (d, h, hd))

  def __call__(self, c_BTD, positions):
    proj = lambda w: layers.dense(c_BTD, w)
    return layers.rope(proj(self.wk), positions, self.dims.rope_theta), proj(self.wv)


def cross_impl(impl: str) -> str:
  """Splash, cuDNN and the CPU kernel cannot express block='earlier' (a dynamic inequality): a
  model that names one runs its cross attention on the chunked XLA path (`auto` picks per call)."""
  return attention.impl_for(impl, CROSS_RULE)


class ComboAttention(nn.Module):
  """Self attention over the generation stream + cross attention over context latents, merged
  exactly by LSE. `cross_kv(c, positions)` and `step` expose the parts the KV cache needs."""

  dims: layers.Dims
  separate_cross_kv: bool = False

  def setup(self):
    self.attn = layers.Attention(self.dims, fused_qkv=False)  # the authors' q [d, d], kv [d, 2d]
    if self.separate_cross_kv:
      self.cross = CrossKV(self.dims)

  def cross_kv(self, c_BTD, positions):
    return self.cross(c_BTD, positions) if self.separate_cross_kv else self.attn.project_kv(c_BTD, positions)

  def __call__(self, x_BTD, c_BTD, slots: attention.Slots):
    pos = slots.layout.tok
    q = self.attn.project_q(x_BTD, pos)
    ks, vs = self.attn.project_kv(x_BTD, pos)
    kc, vc = self.cross_kv(c_BTD, pos)
    kw = dict(chunk_q=self.dims.attention_chunk, chunk_k=self.dims.attention_chunk, return_lse=True)
    o_s, lse_s = attention.attend(q, ks, vs, SELF_RULE, slots, slots, impl=self.dims.attention_impl, **kw)
    o_c, lse_c = attention.attend(q, kc, vc, CROSS_RULE, slots, slots, impl=cross_impl(self.dims.attention_impl), **kw)
    o, _ = attention.merge_lse(o_s, lse_s, o_c, lse_c)
    return self.attn.output(o)


class GenLayer(nn.Module):
  dims: layers.Dims
  separate_cross_kv: bool = False

  def setup(self):
    self.attn_norm = layers.RMSNorm(self.dims.norm_eps)
    self.combo = ComboAttention(self.dims, self.separate_cross_kv)
    self.mlp_norm = layers.RMSNorm(self.dims.norm_eps)
    self.mlp = layers.GeluMLP(self.dims, hidden=4 * self.dims.d_model)  # the generation decoder's: 4d

  def __call__(self, x_BTD, c_BTD, segment_BT, block_BT):
    # Arrays, not a Slots object, so nn.remat can trace the arguments.
    segment_BT = layers.attention_segment(self.dims, segment_BT)
    slots = attention.Slots(masks.Layout.causal(x_BTD.shape[1]), segment=segment_BT, block=block_BT)
    x_BTD = x_BTD + self.combo(self.attn_norm(x_BTD), c_BTD, slots)
    x_BTD = x_BTD + self.mlp(self.mlp_norm(x_BTD))
    return nn.with_logical_constraint(x_BTD, ("batch", "length", "act_embed"))


class DoubleDecoder(nn.Module):
  """tokens, segment [B, T], block [1 or B, T] -> logits [B, T, V] of the generation decoder."""

  dims: layers.Dims
  context_layers: int
  gen_layers: int
  separate_cross_kv: bool = False

  def setup(self):
    self.embed = layers.Embedder(self.dims)
    self.context = layers.Stack(self.dims, CONTEXT_RULE, n_layers=self.context_layers)
    cls = GenLayer
    if self.dims.remat != "none":
      cls = nn.remat(GenLayer, policy=layers.remat_policy(self.dims.remat), static_argnums=())
    self.gen = [cls(self.dims, self.separate_cross_kv) for _ in range(self.gen_layers)]
    self.gen_norm = layers.final_norm(self.dims)

  def context_latents(self, tokens_BT, segment_BT):
    slots = attention.Slots(masks.Layout.causal(tokens_BT.shape[1]), segment=segment_BT)
    return self.context(self._embed(tokens_BT), slots)

  def _embed(self, tokens_BT):
    return nn.with_logical_constraint(self.embed.encode(tokens_BT), ("batch", "length", "act_embed"))

  def __call__(self, tokens_BT, segment_BT, block_BT):
    c = self.context_latents(tokens_BT, segment_BT)
    x = self._embed(tokens_BT)
    for layer in self.gen:
      x = layer(x, c, segment_BT, block_BT)
    return self.embed.decode(self.gen_norm(x))

  # -- pieces for cached decoding (nsl/models/dd_decode.py) ---------------------------------------
  def cross_cache(self, tokens_BN, segment_BN):
    """Per generation layer, the cross K/V of the context latents of a prompt: [Lg, B, N, H, Dh]."""
    c = self.context_latents(tokens_BN, segment_BN)
    pos = jnp.arange(tokens_BN.shape[1], dtype=jnp.int32)
    kv = [layer.combo.cross_kv(c, pos) for layer in self.gen]
    return jnp.stack([k for k, _ in kv]), jnp.stack([v for _, v in kv])

  def gen_step(self, token_B, index, cross_k, cross_v, cross_len, self_cache, block_start):
    """One generation-decoder step for the token at position `index` (all rows in step).

    cross_k/v, per generation layer (a stacked array or a tuple of per-layer ones), head-major as
    the cache: K [B, H, Dh, Nc], V [B, H, Nc, Dh] (`kv_cache.head_major`), the context latents'
    K/V at positions 0..Nc-1 (only < cross_len are earlier-block keys); `self_cache`: the current
    block's K/V in the shared `kv_cache.KVCache` (Lg layers), entry j = position block_start + j
    (later entries are unwritten or stale and masked). Returns (logits [B, V], self_cache with
    this token's K/V written).
    """
    x = self._embed(token_B[:, None])  # [B, 1, D]
    pos_q = jnp.reshape(index, (1,)).astype(jnp.int32)
    nc = cross_v[0].shape[-2]
    rel = pos_q - block_start  # the token's slot in the block's cache
    step = self_cache.step(rel, rel, jnp.full((1,), masks.PERSISTENT, jnp.int32), jnp.ones((x.shape[0], 1), jnp.int32))
    q_f = {"pos": pos_q, "tok": pos_q, "block": jnp.ones((1,), jnp.int32)}
    c_pos = jnp.arange(nc, dtype=jnp.int32)
    c_f = {"pos": c_pos, "tok": c_pos, "block": jnp.where(c_pos < cross_len, 0, 1)}
    vis_c = masks.visible(CROSS_RULE, {n: a[:, None] for n, a in q_f.items()}, {n: a[None] for n, a in c_f.items()})
    vis_c = jnp.broadcast_to(vis_c, (x.shape[0], 1, 1, nc))
    for i, layer in enumerate(self.gen):
      h = layer.attn_norm(x)
      q = layer.combo.attn.project_q(h, pos_q)
      k, v = layer.combo.attn.project_kv(h, pos_q)
      o_s, lse_s = self_cache.attend(q, k, v, SELF_RULE, step, i, return_lse=True)  # one block: no block field
      self_cache = self_cache.write_kv(i, k, v, step, after=o_s)
      o_c, lse_c = kv_cache.attend_parts(q, [(cross_k[i], cross_v[i], vis_c, True)], return_lse=True)
      o, _ = attention.merge_lse(o_s, lse_s, o_c, lse_c)
      x = x + layer.combo.attn.output(o)
      x = x + layer.mlp(layer.mlp_norm(x))
    return self.embed.decode(self.gen_norm(x))[:, 0], self_cache.commit(step)


# ----------------------------------------------------------------------------- family


CROSS_KV = ("shared", "separate")


@dataclasses.dataclass(frozen=True)
class DDSpec:
  """`config.double_decoder` (nsl.schema): the double decoder's options, checked in
  `DoubleDecoderFamily.validate`."""

  gen_layers: int | None = None  # generation-decoder layers; None = model.n_layers // 3 (2:1)
  cross_kv: str = "shared"  # CROSS_KV: the cross K/V reuse the self K/V projections, or own ones
  prompt_lengths_file: str = ""  # prompt_style: a .npy of prompt lengths (the authors' SFT histogram)

  def prompt_lengths(self):
    """The prompt lengths `prompt_style` draws from (None without a file)."""
    return np.load(self.prompt_lengths_file) if self.prompt_lengths_file else None


def split_layers(config) -> tuple[int, int]:
  """(context layers, generation layers) from model.n_layers (total) and double_decoder.gen_layers."""
  total = int(config.model.n_layers)
  gen = DoubleDecoderFamily.options_of(config).gen_layers
  gen = total // 3 if gen is None else gen
  return total - gen, gen


class DoubleDecoderFamily(Family):
  """Context decoder + generation decoder; variants are the block-sampling strategies."""

  name = "double_decoder"
  variants = BLOCK_STRATEGIES
  init_len = 16
  hf_refusal = ("the double decoder is two decoders (context and generation) merged by log-sum-exp over "
                "blocks; no transformers architecture has that form")
  options = DDSpec
  # Where configs written before `config.double_decoder` set these (nsl.options.upgrade).
  legacy = {"model.gen_layers": "gen_layers", "model.dd_cross_kv": "cross_kv",
            "model.dd_prompt_lengths": "prompt_lengths_file"}
  legacy_if_set = ("prompt_lengths_file",)

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    ctx, gen = split_layers(config)
    spec = cls.options_of(config)
    if gen < 1 or ctx < 1:
      raise ConfigError(f"config.double_decoder.gen_layers={spec.gen_layers} must be in "
                        f"[1, model.n_layers-1={config.model.n_layers - 1}]")
    if spec.cross_kv not in CROSS_KV:
      raise ConfigError(f"config.double_decoder.cross_kv={spec.cross_kv!r} must be 'shared' or 'separate'")
    if config.data.seq_len < MAX_BOUNDARIES + 5:
      raise ConfigError(f"config.data.seq_len={config.data.seq_len} is too short for block sampling "
                        f"(need >= {MAX_BOUNDARIES + 5})")
    if config.model.variant == "prompt_style":
      import os
      path = spec.prompt_lengths_file
      if not path or not os.path.isfile(path):
        raise ConfigError(f"config.double_decoder.prompt_lengths_file={path!r}: variant 'prompt_style' draws its boundary "
                          "from a .npy file of SFT prompt lengths (token counts, one per prompt); give its path")

  @property
  def separate_cross_kv(self) -> bool:
    return self.options_of(self.config).cross_kv == "separate"

  def make_model(self):
    ctx, gen = split_layers(self.config)
    return DoubleDecoder(self.dims, ctx, gen, self.separate_cross_kv)

  def model_inputs(self, batch):
    inputs, _, seg_in, _ = cross_entropy.next_token_targets(batch)
    return inputs, seg_in, jnp.zeros((1, inputs.shape[1]), jnp.int32)

  def blocks(self, rng, seq_len: int | None = None):
    spec = self.options_of(self.config)
    return sample_blocks(rng, seq_len or self.seq_len, self.config.model.variant, spec.prompt_lengths())

  def loss_blocks(self, rng, seq_len: int):
    """The block ids [1, T] the loss draws from its step rng."""
    return self.blocks(jax.random.fold_in(rng, 0x0DD), seq_len)

  @property
  def rule(self) -> masks.Rule:
    """The context decoder's rule (the generation decoder's are SELF_RULE and CROSS_RULE)."""
    return CONTEXT_RULE

  def with_rule(self, rule: masks.Rule):
    raise NslError("family 'double_decoder' has three fixed attention rules (context, self, cross), no single "
                   "rule to replace; run this probe on a standard or SPS run")

  def token_logits(self, params, batch, *, model=None, block_BT=None):
    """The generation decoder's next-token logits [B, T, V] (`Family.token_logits`) under block
    ids `block_BT` [1 or B, T]; default the blocks of the trainer's eval step (the loss at rng
    PRNGKey(0)), so the NLL of these logits is `eval_val_nll`. Both decoders are causal, so row t
    sees inputs <= t for any blocks."""
    inputs, seg_in, _ = self.model_inputs(batch)
    if block_BT is None:
      block_BT = self.loss_blocks(jax.random.PRNGKey(0), inputs.shape[1])
    return (model or self.model).apply({"params": params}, inputs, seg_in, block_BT)

  def loss(self, params, batch, rng, step):
    _, targets, _, weights = cross_entropy.next_token_targets(batch)
    block = self.loss_blocks(rng, targets.shape[1])
    logits = self.token_logits(params, batch, block_BT=block)
    loss, weight = cross_entropy.masked_cross_entropy(logits, targets, weights)
    return loss, {"weight": weight, "blocks": jnp.max(block).astype(jnp.float32) + 1.0}

  def decoder(self):
    """Cached generation (docs/papers/double_decoder.md#generation): the prompt is context, the new tokens one
    block from its last token on (`nsl.models.dd_decode.decoder`)."""
    return dd_decode.decoder(self)

  def continuation_logits(self, params, batch, start_B):
    """`Family.continuation_logits`: the inputs before `start_B` [B] are the context (block 0) and
    the continuation one block from the last context token on, as the decoder generates it."""
    t = batch["tokens"].shape[1] - 1
    block_BT = (jnp.arange(t, dtype=jnp.int32)[None] >= jnp.asarray(start_B, jnp.int32)[:, None]).astype(jnp.int32)
    return self.token_logits(params, batch, block_BT=block_BT)

  def flops_per_token(self) -> float:
    """6 x (parameters + the cross K/V projection of the context stream when shared) per token,
    plus visible attention pairs: causal for the context decoder, self + cross for the generation
    decoder (causal + the first block's length, averaged over 16 block draws)."""
    t, d = self.seq_len, self.dims.d_model
    ctx, gen = split_layers(self.config)
    matmul = self.param_counts()["params_total"]
    if not self.separate_cross_kv:
      matmul += gen * 2 * d * d  # W_k, W_v applied to the context latents too
    causal_pairs = t * (t + 1) / 2
    # self ∪ cross = every causal pair; they overlap only at the token-0 sink for block-0 queries
    # (seen once as a self key, once as a cross key): gen pairs = causal + |block 0| (tested).
    first_block = np.mean([int((np.asarray(self.blocks(jax.random.PRNGKey(i), t)) == 0).sum()) for i in range(16)])
    gen_pairs = [causal_pairs + first_block]
    pairs = ctx * causal_pairs + gen * float(np.mean(gen_pairs))
    return train_flops_per_token(matmul, pairs / t, 1, d)
