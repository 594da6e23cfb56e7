"""Shared building blocks of every family (docs/papers/sps.md#architecture).

Pre-norm RMSNorm, rotary position embeddings, SwiGLU MLP with hidden 3d, no biases, tied input
embedding and output head. Small general options for other papers' trunks (the double-decoder
authors', docs/xcheck/dd.md): `model.mlp='gelu'` (GELU-tanh MLP of hidden d_ff), `model.final_norm=
'layernorm'` (LayerNorm with bias after the last block), `model.init='xavier_uniform'` (torch's
xavier-uniform with gain sqrt(2) on every matrix, fans as the matching nn.Linear), and
`model.document_mask=False` (attention crosses document boundaries in a packed row; padding,
segment 0, stays apart). Parameters are float32 and carry logical axis names
(`nn.with_logical_partitioning`) so one rules table maps them onto the mesh; computation runs in
`Dims.dtype`. Attention goes through `nsl.nn.attention.attend` with a `nsl.nn.masks.Rule`.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from nsl.errors import ConfigError
from nsl.nn import attention, cross_entropy, masks
from nsl.kernels import decode_cpu, registry


@dataclasses.dataclass(frozen=True)
class Dims:
  """The static model hyper-parameters the layers need (hashable, unlike a ConfigDict)."""

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  d_ff: int
  rope_theta: float = 10000.0
  norm_eps: float = 1e-5
  init_std: float = 0.02
  dtype: str = "float32"
  remat: str = "none"
  scan_layers: bool = False
  attention_impl: str = "auto"
  attention_chunk: int = 0  # 0: nsl.nn.attention.tile_size
  mup_base_width: int | None = 0  # μP base width (nsl/nn/mup.py); 0 / None = off
  tie_embeddings: bool = True  # False: a separate output head `embed/head` [V, D] (NextLat's authors)
  # Output projections (attention out, MLP down) start at std/sqrt(2·layers) (GPT-2); False: at
  # std like every other matrix (NextLat's authors, docs/xcheck/nextlat.md).
  scaled_out_init: bool = True
  # With scaled_out_init, False leaves the MLP's down projection at std (the attention output
  # stays scaled): the SPS authors' model, whose SwiGLU down_proj misses nanoGPT's c_proj scaling
  # (docs/xcheck/sps.md).
  scaled_mlp_out_init: bool = True
  mup_base_head_dim: int = 64  # μP attention: scores q·k·sqrt(this)/d_head (1: q·k/d_head)
  mup_readout: str = "sqrt"  # μP logits × 1/sqrt(m) ("sqrt") or × 1/m ("linear")
  mlp: str = "swiglu"  # MLPS
  final_norm: str = "rmsnorm"  # FINAL_NORMS
  init: str = "normal"  # INITS
  document_mask: bool = True  # attention stays within a document of a packed row

  def __post_init__(self):
    for field, allowed in (("mlp", MLPS), ("final_norm", FINAL_NORMS), ("init", INITS), ("mup_readout", READOUTS)):
      if getattr(self, field) not in allowed:
        raise ConfigError(f"config.model.{field}={getattr(self, field)!r} must be one of {allowed}")
    b = self.mup_base_head_dim
    if not isinstance(b, int) or isinstance(b, bool) or b < 1:
      raise ConfigError(f"config.model.mup_base_head_dim={b!r} must be a positive integer (the μP head size "
                        "at the base width: 64 in the double-decoder paper; 1 gives scores q·k/d_head)")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads

  @property
  def mup_mult(self) -> float | None:
    """μP width multiplier m = d_model / mup_base_width; None when μP is off."""
    return self.d_model / self.mup_base_width if self.mup_base_width else None

  @property
  def hidden_std(self) -> float:
    """Init std of the hidden (matrix-like) weights: init_std, divided by sqrt(m) under μP."""
    m = self.mup_mult
    return self.init_std if m is None else self.init_std / math.sqrt(m)

  @property
  def query_scale(self) -> float | None:
    """μP attention: queries are multiplied by sqrt(b / d_head), b = `mup_base_head_dim`, so the
    shared attention path's 1/sqrt(d_head) gives scores q·k·sqrt(b)/d_head: the standard scale at
    the base head width (the double-decoder authors'); b = 1 gives q·k/d_head. None (no multiply)
    when μP is off (nsl/nn/mup.py)."""
    return math.sqrt(self.mup_base_head_dim / self.head_dim) if self.mup_mult is not None else None

  @property
  def logit_scale(self) -> float | None:
    """μP output multiplier of the tied head: 1/sqrt(m) (`mup_readout='sqrt'`, the double-decoder
    authors') or 1/m (`'linear'`, the `mup` package's MuSharedReadout); None when μP is off."""
    m = self.mup_mult
    if m is None:
      return None
    return 1.0 / math.sqrt(m) if self.mup_readout == "sqrt" else 1.0 / m

  @property
  def compute_dtype(self):
    """'auto' = bfloat16 on accelerators, float32 on CPU (where bfloat16 matmuls are emulated);
    the platform is the context mesh's, so a TPU compile from a CPU host gets bfloat16."""
    if self.dtype == "auto":
      from nsl import sharding
      return jnp.dtype(jnp.float32 if sharding.platform() == "cpu" else jnp.bfloat16)
    return jnp.dtype(self.dtype)

  @staticmethod
  def from_config(config, **overrides) -> "Dims":
    """`config.model` as Dims, each field typed (`nsl.schema.read`); `overrides` replace some."""
    from nsl import schema

    return schema.read(Dims, config.model, "model", **overrides)


MLPS = ("swiglu", "gelu")
FINAL_NORMS = ("rmsnorm", "layernorm")
INITS = ("normal", "xavier_uniform")
READOUTS = ("sqrt", "linear")
XAVIER_GAIN = math.sqrt(2.0)  # the double-decoder authors' xavier_uniform_(w, gain=sqrt(2))
LAYERNORM_EPS = 1e-5  # torch.nn.LayerNorm's default


def _init(std: float, axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=std), axes)


def residual_out_std(dims: "Dims", std: float, mlp: bool = False) -> float:
  """Init std of a residual branch's output projection: std/sqrt(2·layers) (GPT-2's residual
  scaling), or std itself with `dims.scaled_out_init` off (or, for the MLP's, with
  `dims.scaled_mlp_out_init` off)."""
  scaled = dims.scaled_out_init and (dims.scaled_mlp_out_init or not mlp)
  return std / math.sqrt(2 * dims.n_layers) if scaled else std


def weight_init(dims: "Dims", std: float, axes: tuple[str | None, ...], fans: tuple[int, int]):
  """A matrix's initializer: normal(std) (`dims.init='normal'`), or uniform in
  ±gain·sqrt(6 / (fan_in + fan_out)) with gain sqrt(2) (`'xavier_uniform'`), where `fans` are
  those of the torch nn.Linear(fan_in, fan_out) the weight stands for (a fused q/k/v projection
  counts its 3d outputs) so the distribution equals torch.nn.init.xavier_uniform_'s."""
  if dims.init != "xavier_uniform":
    return _init(std, axes)
  bound = XAVIER_GAIN * math.sqrt(6.0 / (fans[0] + fans[1]))
  uniform = lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)
  return nn.with_logical_partitioning(uniform, axes)


def attention_segment(dims: "Dims", segment):
  """The segment ids attention compares: the documents, or with `dims.document_mask` off one id
  for every real token (padding, 0, stays apart)."""
  if segment is None or dims.document_mask:
    return segment
  return (segment > 0).astype(segment.dtype)


def dense(x, w, n_in: int = 1, *, transpose_w: bool = False, preferred_element_type=None):
  """x's last `n_in` axes contracted with w's first `n_in` (`transpose_w`: w [out, in], with
  its last axis); the einsum "...i,io->...o".

  On CPU (the context mesh's platform) as one 2-D matmul over all leading positions [B·S, in]:
  XLA:CPU runs the weight gradient of a 3-D contraction (batch and length contracted together)
  far slower, measured on 2 cores at 8 × 256 tokens, d 256: SwiGLU forward + backward 127 -> 53
  ms (the train step: docs/benchmarks.md#profiles). Elsewhere one `dot_general` over the original axes,
  as the einsum lowers: libtpu's memory-space assignment aborted the process on the reshaped
  form of LIFT's state embedding (a check failure, not an exception)."""
  from nsl import sharding
  w = w.astype(x.dtype)
  w_in = tuple(range(w.ndim - n_in, w.ndim)) if transpose_w else tuple(range(n_in))
  if sharding.platform() != "cpu":
    x_in = tuple(range(x.ndim - n_in, x.ndim))
    return jax.lax.dot_general(x, w, ((x_in, w_in), ((), ())), preferred_element_type=preferred_element_type)
  lead, k = x.shape[:x.ndim - n_in], math.prod(x.shape[x.ndim - n_in:])
  if transpose_w:
    out_shape, w2 = w.shape[:w.ndim - n_in], w.reshape(-1, k).T
  else:
    out_shape, w2 = w.shape[n_in:], w.reshape(k, -1)
  x2 = x.reshape(-1, k)
  if not transpose_w and registry.pick_call("matmul", x2, w2) == "decode_cpu":  # a decode step's few rows
    y = decode_cpu.matmul(x2, w2).astype(preferred_element_type or x.dtype)
  else:
    y = jnp.dot(x2, w2, preferred_element_type=preferred_element_type)
  return y.reshape(lead + out_shape)


class LayerNorm(nn.Module):
  """y = (x - mean) / sqrt(var + eps) · g + b, computed in float32 (torch.nn.LayerNorm's form)."""

  eps: float = LAYERNORM_EPS

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (x.shape[-1],))
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (x.shape[-1],))
    x32 = x.astype(jnp.float32)
    c = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    y = c * jax.lax.rsqrt(jnp.mean(c * c, axis=-1, keepdims=True) + self.eps)
    return (y * scale + bias).astype(x.dtype)


def final_norm(dims: "Dims", name: str | None = None) -> nn.Module:
  """The norm after a stack of blocks: RMSNorm, or LayerNorm (`dims.final_norm='layernorm'`)."""
  if dims.final_norm == "layernorm":
    return LayerNorm(name=name)
  return RMSNorm(dims.norm_eps, name=name)


class RMSNorm(nn.Module):
  """y = x / sqrt(mean(x²) + eps) · g, computed in float32."""

  eps: float = 1e-5

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (x.shape[-1],))
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (y * scale).astype(x.dtype)


def rope_table(positions_S, head_dim: int, theta: float):
  """(sin, cos) [..., S, head_dim/2] of RoPE's angles positions · θ^(-2j/head_dim)."""
  freqs = theta ** (-jnp.arange(0, head_dim // 2, dtype=jnp.float32) * 2.0 / head_dim)
  angles = jnp.asarray(positions_S, jnp.float32)[..., None] * freqs
  return jnp.sin(angles), jnp.cos(angles)


def rope(x_BSHD, positions_S, theta: float, table=None):
  """Rotary embedding (Su et al. 2021), rotate-half convention, positions [S] or [B, S].
  `table`: their (sin, cos) from `rope_table`, made once outside a token loop (decode): computed
  here, XLA fuses sin and cos into the rotation and evaluates them per element of x, B·H times
  per position (0.8 ms of an SPS XS decode step)."""
  sin, cos = rope_table(positions_S, x_BSHD.shape[-1], theta) if table is None else table
  if sin.ndim == 2:
    sin, cos = sin[None], cos[None]
  sin, cos = sin[:, :, None, :], cos[:, :, None, :]
  x1, x2 = jnp.split(x_BSHD.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BSHD.dtype)


class Embedder(nn.Module):
  """Tied token embedding: `encode` looks tokens up, `decode` is the output head (x · Eᵀ). With
  `dims.tie_embeddings` off the head is its own matrix `head` [V, D] (x · Hᵀ), initialised as the
  embedding (NextLat's authors: nn.Embedding and a bias-free nn.Linear head)."""

  dims: Dims

  def setup(self):
    self.embedding = self.param("embedding", weight_init(self.dims, self.dims.init_std, ("vocab", "embed"),
                                                         (self.dims.d_model, self.dims.vocab_size)),
                                (self.dims.vocab_size, self.dims.d_model))
    if not self.dims.tie_embeddings:
      self.out = self.param("head", _init(self.dims.init_std, ("vocab", "embed")),
                            (self.dims.vocab_size, self.dims.d_model))

  def head_weight(self):
    """The output head's matrix [V, D]: the embedding itself, or the untied `head`."""
    return self.embedding if self.dims.tie_embeddings else self.out

  def encode(self, tokens_BT):
    return jnp.take(self.embedding, tokens_BT, axis=0).astype(self.dims.compute_dtype)

  def decode(self, h_BSD):
    """Logits in float32 (the softmax of a 50k vocabulary needs it). Under μP they are multiplied
    by `dims.logit_scale` (1/sqrt(m) or 1/m): with the tied embedding this is μP's "output
    multiplier" form of the readout rule (the embedding stays vector-like: constant init and LR;
    nsl/nn/mup.py)."""
    logits = dense(h_BSD, self.head_weight(), transpose_w=True, preferred_element_type=jnp.float32)
    return logits if self.dims.logit_scale is None else logits * self.dims.logit_scale

  def cross_entropy(self, h_BSD, targets_BS, weights_BS):
    """`cross_entropy.masked_cross_entropy(self.decode(h), targets, weights)`, equal to it; on CPU without the
    [B·S, V] logits (`head_cross_entropy`)."""
    from nsl import sharding
    # The accelerators' fits (docs/guide/pods.md#what-fits-where) are of the logits path.
    if sharding.platform() != "cpu":
      return cross_entropy.masked_cross_entropy(self.decode(h_BSD), targets_BS, weights_BS)
    scale = 1.0 if self.dims.logit_scale is None else self.dims.logit_scale
    d = h_BSD.shape[-1]
    return cross_entropy.head_cross_entropy(h_BSD.reshape(-1, d), self.head_weight(), targets_BS.reshape(-1),
                              weights_BS.reshape(-1).astype(jnp.float32), scale)


class Attention(nn.Module):
  """Multi-head attention; `project` and `output` are separate so decoders can cache K/V.

  Under μP (`dims.mup_base_width`) `project_q` also multiplies the queries by
  `dims.query_scale`, so scores are q·k·sqrt(b)/d_head (μP attention) through the unchanged
  attention path, and the weights start at `dims.hidden_std`. `fused_qkv`: which torch layout
  the xavier fans follow (one [d, 3d] q/k/v projection, or q [d, d] and k/v [d, 2d])."""

  dims: Dims
  fused_qkv: bool = True

  def setup(self):
    d, h, hd, std = self.dims.d_model, self.dims.n_heads, self.dims.head_dim, self.dims.hidden_std
    out_std = residual_out_std(self.dims, std)  # GPT-2 residual scaling
    ax = ("embed", "heads", "head_dim")
    q_fans, kv_fans = ((d, 3 * d), (d, 3 * d)) if self.fused_qkv else ((d, d), (d, 2 * d))
    self.wq = self.param("wq", weight_init(self.dims, std, ax, q_fans), (d, h, hd))
    self.wk = self.param("wk", weight_init(self.dims, std, ax, kv_fans), (d, h, hd))
    self.wv = self.param("wv", weight_init(self.dims, std, ax, kv_fans), (d, h, hd))
    self.wo = self.param("wo", weight_init(self.dims, out_std, ("heads", "head_dim", "embed"), (d, d)), (h, hd, d))

  def _proj(self, x, w):
    return dense(x, w)

  def project_q(self, x_BSD, positions, table=None):
    q = rope(self._proj(x_BSD, self.wq), positions, self.dims.rope_theta, table)
    return q if self.dims.query_scale is None else q * jnp.asarray(self.dims.query_scale, q.dtype)

  def project_kv(self, x_BSD, positions, table=None):
    return rope(self._proj(x_BSD, self.wk), positions, self.dims.rope_theta, table), self._proj(x_BSD, self.wv)

  def output(self, o_BSHD):
    return dense(o_BSHD, self.wo, n_in=2)

  def __call__(self, x_BSD, rule: masks.Rule, slots: attention.Slots | None, cache=None, step=None, layer=None,
               queries: tuple[int, ...] | None = None):
    """Self-attention of a stream under `rule`; RoPE positions are the slots' `tok`.

    Without a cache: training, over `slots` (static layout + dynamic segment), returns y. With a
    `kv_cache.KVCache`, the new slots `step` (a `kv_cache.Step`) of layer `layer` (an index,
    traced under a scan) attend over the cached keys plus their own (`step.prefill`: over their
    own only, through the training path with `slots`), their K/V are written, and the result
    is `(cache, y)` (Flax gemma's cached attention), with the same parameters. `queries` (a
    cached step): only these new slots query, so y is [B, len(queries), D]; every slot's K/V is
    still written (`Stack`'s last layer, whose other outputs nothing reads)."""
    tok = slots.layout.tok if step is None else step.tok
    table = None if step is None else step.rope  # a token loop's RoPE rows (`kv_cache.Step.rope`)
    if queries is None:
      q = self.project_q(x_BSD, tok, table)
    else:
      idx = np.asarray(queries)
      q = self.project_q(x_BSD[:, idx], tok[idx], None if table is None else tuple(t[..., idx, :] for t in table))
    k, v = self.project_kv(x_BSD, tok, table)
    if cache is None or step.prefill:
      if queries is not None:
        raise ValueError("queries= selects slots of a cached decode step, not of training or a prefill")
      constrain = lambda t: nn.with_logical_constraint(t, ("batch", "length", "heads", "head_dim"))
      o = attention.attend(constrain(q), constrain(k), constrain(v), rule, slots, slots,
                           impl=self.dims.attention_impl, chunk_q=self.dims.attention_chunk,
                           chunk_k=self.dims.attention_chunk)
      if cache is None:
        return self.output(o)
      return cache.write_kv(layer, k, v, step, after=o), self.output(o)
    cache, o = cache.attend_write(q, k, v, rule, step, layer, queries=queries)
    return cache, self.output(o)


class SwiGLU(nn.Module):
  """W_down (SiLU(x W_gate) ⊙ x W_up), hidden d_ff (= 3d in the SPS ladder)."""

  dims: Dims

  @nn.compact
  def __call__(self, x_BSD):
    d, f, std = self.dims.d_model, self.dims.d_ff, self.dims.hidden_std
    w_gate = self.param("w_gate", weight_init(self.dims, std, ("embed", "mlp"), (d, f)), (d, f))
    w_up = self.param("w_up", weight_init(self.dims, std, ("embed", "mlp"), (d, f)), (d, f))
    w_down = self.param("w_down", weight_init(self.dims, residual_out_std(self.dims, std, mlp=True), ("mlp", "embed"),
                                              (f, d)), (f, d))
    hidden = jax.nn.silu(dense(x_BSD, w_gate)) * dense(x_BSD, w_up)
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
    return dense(hidden, w_down)


class GeluMLP(nn.Module):
  """W_out GELU(x W_in) with the tanh approximation, no biases; hidden `hidden` (default d_ff)."""

  dims: Dims
  hidden: int | None = None

  @nn.compact
  def __call__(self, x_BSD):
    d, std = self.dims.d_model, self.dims.hidden_std
    f = self.hidden or self.dims.d_ff
    w_in = self.param("w_in", weight_init(self.dims, std, ("embed", "mlp"), (d, f)), (d, f))
    w_out = self.param("w_out", weight_init(self.dims, residual_out_std(self.dims, std, mlp=True), ("mlp", "embed"),
                                            (f, d)), (f, d))
    h = jax.nn.gelu(dense(x_BSD, w_in), approximate=True)
    return dense(nn.with_logical_constraint(h, ("batch", "length", "mlp")), w_out)


def mlp(dims: Dims, name: str | None = None) -> nn.Module:
  """The block's MLP: SwiGLU, or GELU (`dims.mlp='gelu'`), hidden d_ff."""
  return GeluMLP(dims, name=name) if dims.mlp == "gelu" else SwiGLU(dims, name=name)


class Block(nn.Module):
  """Pre-norm residual block: x + Attn(RMSNorm(x)); x + MLP(RMSNorm(x)). With a cache (see
  `Attention`) it returns `(cache, x)`."""

  dims: Dims
  rule: masks.Rule
  layout: masks.Layout | None  # static slot metadata (None: a cached decode step, metadata in `step`)

  @nn.compact
  def __call__(self, x_BSD, segment=None, block=None, cache=None, step=None, layer=None, queries=None):
    """`queries` (a cached step, see `Attention`): the block's output is only these slots'."""
    slots = None if self.layout is None else attention.Slots(self.layout, segment=segment, block=block)
    a = Attention(self.dims, name="attn")(RMSNorm(self.dims.norm_eps, name="attn_norm")(x_BSD), self.rule, slots,
                                          cache=cache, step=step, layer=layer, queries=queries)
    if cache is not None:
      cache, a = a
    if queries is not None:
      x_BSD = x_BSD[:, np.asarray(queries)]
    x_BSD = x_BSD + a
    x_BSD = x_BSD + mlp(self.dims, name="mlp")(RMSNorm(self.dims.norm_eps, name="mlp_norm")(x_BSD))
    x_BSD = nn.with_logical_constraint(x_BSD, ("batch", "length", "act_embed"))
    return x_BSD if cache is None else (cache, x_BSD)


def remat_policy(name: str):
  return {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}.get(name)


class ScannedBlock(Block):
  """A Block as the body of `nn.scan`: (x, broadcast inputs) -> (x, None); for a cached call
  also the cache (broadcast) and this layer's K/V slices (scanned) -> (x, this layer's new K/V),
  through `KVCache.layer_view` (the full cache is written once after the scan)."""

  @nn.compact
  def __call__(self, x_BSD, segment=None, block=None, step=None, cache=None, kv=None):
    if step is None:
      return super().__call__(x_BSD, segment, block), None
    view = cache.layer_view(*kv)
    view, x_BSD = super().__call__(x_BSD, segment, block, cache=view, step=step, layer=0)
    return x_BSD, (view.k_new, view.v_new)


class Stack(nn.Module):
  """`n_layers` blocks under one rule, then a final RMSNorm: the shared trunk of every family.

  `dims.scan_layers`: the identical blocks as one `nn.scan` (MaxText's and Levanter's default),
  so XLA compiles one layer body instead of `n_layers` copies; the remat policy sits inside the
  scan. Parameters are then stacked under `layers` with a leading `layers` logical axis (kept
  unsharded by the rules); `layer_params` reads one layer from either form.
  """

  dims: Dims
  rule: masks.Rule
  n_layers: int | None = None  # defaults to dims.n_layers (the double decoder splits them)

  @nn.compact
  def __call__(self, x_BSD, slots: attention.Slots | None, cache=None, step=None, with_residual: bool = False,
               outputs: tuple[int, ...] | None = None):
    """Training: `slots` -> final-normed x. Cached (`cache`, `step`: see `Attention`; `slots`
    for a prefill, else None): -> (cache with the step's K/V and metadata, final-normed x).
    `with_residual`: x becomes the pair (final residual stream before the norm, final-normed x),
    for latents read before the final norm (NextLat's `latent="residual"`). A
    cached call runs without remat; scanned, it is one layer body with the cache
    read as per-layer K/V slices (scanned inputs), the new K/V the scan's outputs, and the cache
    written once after the scan (so it is updated in place, not copied per layer).

    `outputs` (a cached decode step): only these new slots' outputs are returned, and the
    unrolled path's last layer runs its queries, residual and MLP on them alone (its other
    slots' K/V are still written; nothing reads their outputs): an SPS step's x slot. The scanned
    path (one compiled layer body) computes every slot and slices after the scan."""
    n = self.n_layers or self.dims.n_layers
    layout = None if slots is None else slots.layout
    segment = None if slots is None else attention_segment(self.dims, slots.segment)
    blk = None if slots is None else slots.block
    if cache is not None:
      if self.dims.scan_layers:
        scan = nn.scan(ScannedBlock, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast, 0), length=n,
                       metadata_params={nn.PARTITION_NAME: "layers"})
        meta = cache.replace(k=None, v=None)  # broadcast: only the metadata; K/V go in as slices
        x_BSD, (k_new, v_new) = scan(self.dims, self.rule, layout, name="layers")(
            x_BSD, segment, blk, step, meta, (cache.k, cache.v))
        cache = cache.write_layers(k_new, v_new, step)
        if outputs is not None:
          x_BSD = x_BSD[:, np.asarray(outputs)]
      else:
        for i in range(n):
          cache, x_BSD = Block(self.dims, self.rule, layout, name=f"block_{i}")(
              x_BSD, segment, blk, cache=cache, step=step, layer=i, queries=outputs if i == n - 1 else None)
      y_BSD = final_norm(self.dims, name="final_norm")(x_BSD)
      return cache.commit(step), ((x_BSD, y_BSD) if with_residual else y_BSD)
    remat = self.dims.remat != "none"
    if self.dims.scan_layers:
      body = ScannedBlock
      if remat:
        body = nn.remat(body, policy=remat_policy(self.dims.remat), prevent_cse=False)
      scan = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True},
                     in_axes=(nn.broadcast, nn.broadcast), length=n,
                     metadata_params={nn.PARTITION_NAME: "layers"})
      x_BSD, _ = scan(self.dims, self.rule, layout, name="layers")(x_BSD, segment, blk)
    else:
      block_cls = nn.remat(Block, policy=remat_policy(self.dims.remat), static_argnums=()) if remat else Block
      for i in range(n):
        x_BSD = block_cls(self.dims, self.rule, layout, name=f"block_{i}")(x_BSD, segment, blk)
    y_BSD = final_norm(self.dims, name="final_norm")(x_BSD)
    return (x_BSD, y_BSD) if with_residual else y_BSD


def layer_params(stack_params, i: int):
  """Parameters of layer `i` of a Stack, scanned (`layers`, stacked on axis 0) or unrolled."""
  if "layers" in stack_params:
    return jax.tree.map(lambda a: a[i], stack_params["layers"])
  return stack_params[f"block_{i}"]


def scanned_params(stack_params, n_layers: int):
  """A Stack's parameters in the scanned form (`layers`, stacked on axis 0), from either form:
  decoders run every trunk as one scanned layer body (one compile) without changing the stored
  tree."""
  if "layers" in stack_params:
    return stack_params
  blocks = [stack_params[f"block_{i}"] for i in range(n_layers)]
  rest = {k: v for k, v in stack_params.items() if not k.startswith("block_")}
  return {**rest, "layers": jax.tree.map(lambda *a: jnp.stack(a), *blocks)}


def unscanned_params(stack_params, n_layers: int):
  """A Stack's parameters in the unrolled form (`block_i`), from either form: the inverse of
  `scanned_params`. Under jit each layer becomes its own buffer (one copy), which a loop over
  tokens then reads in place (nsl/nn/kv_cache.py, "Per-layer form")."""
  if "layers" not in stack_params:
    return stack_params
  rest = {k: v for k, v in stack_params.items() if k != "layers"}
  return {**rest, **{f"block_{i}": layer_params(stack_params, i) for i in range(n_layers)}}
