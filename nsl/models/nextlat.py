"""NextLat (next-latent prediction, docs/papers/nextlat.md#losses) and the multi-token-prediction baseline MTP.

NextLat is the standard transformer (same trunk, same next-token loss) plus a latent dynamics
model p_ψ that predicts the next final-layer hidden state from the current one and the next
token. As the authors' code builds it (`models/model_nextlat.py`, cross-checked in
tools/xcheck/nextlat.py; docs/xcheck/nextlat.md):

  ĥ_{t+1} = h_t + W₃ GELU(W₂ GELU(W₁ RMSNorm(concat[emb(x_{t+1}), h_t]))),

bias-free Linears, exact (erf) GELU, width `hidden` (theirs: 128·round(proj_factor · 2d / 128),
`latent_spec.authors_hidden`), every matrix initialised N(0, 0.02). h_t is the trunk's final
hidden state and emb the trunk's input embedding. The NextLat configs run the authors' trunk
around it: an output head untied from the embedding (`model.tie_embeddings=False`) and every
matrix at init_std (`model.scaled_out_init=False`). Which vector "the final-layer hidden state"
is (`nextlat.latent`):
- `final_norm` (the default, the authors'): after the final RMSNorm, the vector the head reads.
- `residual`: the final residual stream before that norm. L_next-h and the rollout then live in
  the residual space, and every head read of a latent (L_KL's logits, self-speculative drafts)
  applies the trunk's final RMSNorm first (`read`; its scale frozen in L_KL, like the head).
  Kept for a measurement (docs/xcheck/nextlat.md): nsl's earlier model (tied head, L_KL on the
  dynamics only) collapsed on CPU path-star with the final-normed h and not with this one.
Loss:

  L = L_next-token + λ_h · L_next-h + λ_KL · L_KL
  L_next-h = (1/d) Σ_{i=1..d} mean_t SmoothL1(sg[h_{t+i}], ĥ_{t+i})
  L_KL     = (1/d) Σ_{i=1..d} mean_t KL(softmax(sg[H h_{t+i}]) ‖ softmax(sg[H] ĥ_{t+i}))

ĥ_{t+i} is the i-step recursive rollout of p_ψ from h_t under the teacher-forced tokens
x_{t+1..t+i}. As in the authors' code, the only stop-gradients are the targets (h_{t+i} in
L_next-h, the teacher logits in L_KL) and the head's weights H in L_KL's student logits: both
latent losses reach ψ, the trunk (through h_t) and the input embedding fed to p_ψ (unless
`nextlat.emb_grad` is off: an ablation switch, nsl's earlier reading, chosen when the
embedding was also the head). SmoothL1 is Huber with β = 1 averaged over the hidden dimension. Masks: a rollout pair
(t, i) counts iff t + i < T and positions t..t+i are in one document; L_KL additionally drops
pairs whose position t+i is a prompt position (its target is not trained by CE); L_next-h keeps
prompt positions. Each i is averaged over its valid pairs, then the d terms are averaged. (The
authors mask only rollouts whose target token is EOS, so on packed rows their i ≥ 2 rollouts
may cross a document; on one document per row, path-star and countdown, the two are the same.)

Prompt masking: with `config.data.answer_token = A >= 0`, a next-token target counts only when
an A token occurs at or before its input position in the same document (tasks put A right
after the prompt; see nsl/data/tasks). A batch that carries `labels` is honoured through
`cross_entropy.next_token_targets` as for every family.

Variants of family `nextlat`: `nextlat` (the above) and `gpt` (no dynamics model: the same
trunk, prompt masking and records, the GPT baseline of the planning tasks).

Family `mtp` (Gloeckle et al. 2024 style, docs/papers/nextlat.md#speculative-decoding): d heads on the shared trunk;
head 1 is the plain head (next token), head i ≥ 2 is a residual GELU MLP on h then RMSNorm then
the shared head, predicting token t+i; loss = mean over heads of their masked CE.

Config (`config.nextlat`): lambda_h, lambda_kl, horizon d, hidden (MLP width), draft_len
(self-speculative decoding, nsl/models/nextlat_decode.py), emb_grad, latent. `config.mtp.horizon`. Their
defaults and checks live in nsl/models/latent_spec.py (`NextLatSpec`, `MTPSpec`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from nsl.nn import attention, cross_entropy, layers, masks
from nsl.models.family import NextTokenFamily, train_flops_per_token
from nsl.models.latent_spec import MTPSpec, NextLatSpec, answer_token
from nsl.models.transformer import LM, standard_rule

sg = jax.lax.stop_gradient


def answer_weights(inputs_BT, seg_BT, answer_token: int):
  """1.0 where an `answer_token` occurs at or before position t within t's document, else 0."""
  a = (inputs_BT == answer_token).astype(jnp.int32)
  c = jnp.cumsum(a, axis=1)
  start = jnp.concatenate([jnp.ones_like(seg_BT[:, :1], bool), seg_BT[:, 1:] != seg_BT[:, :-1]], axis=1)
  base = jax.lax.cummax(jnp.where(start, c - a, 0), axis=1)  # answer tokens before the document
  return ((c - base) > 0).astype(jnp.float32)


def task_targets(batch: dict[str, Any], answer_token: int):
  """`cross_entropy.next_token_targets`, with prompt targets dropped when `answer_token >= 0`."""
  inputs, targets, seg_in, weights = cross_entropy.next_token_targets(batch)
  if answer_token >= 0:
    weights = weights * answer_weights(inputs, seg_in, answer_token)
  return inputs, targets, seg_in, weights


def shift_left(x, i: int):
  """x[:, t + i] at t (zeros past the end), for [B, T, ...] arrays."""
  if i == 0:
    return x
  pad = jnp.zeros((x.shape[0], i) + x.shape[2:], x.dtype)
  return jnp.concatenate([x[:, i:], pad], axis=1)


def rollout_valid(seg_BT, i: int):
  """Pairs (t, t+i) inside one (non-padding) document and inside the window."""
  t = seg_BT.shape[1]
  inside = (jnp.arange(t) + i < t)[None, :]
  return inside & (seg_BT == shift_left(seg_BT, i)) & (seg_BT > 0)


def smooth_l1(pred, target):
  """SmoothL1 (β = 1) averaged over the last axis."""
  return jnp.mean(optax.huber_loss(pred.astype(jnp.float32), target.astype(jnp.float32), delta=1.0), axis=-1)


def kl_logits(p_logits, q_logits):
  """KL(softmax(p) ‖ softmax(q)) over the last axis, float32."""
  lp = jax.nn.log_softmax(p_logits.astype(jnp.float32), axis=-1)
  lq = jax.nn.log_softmax(q_logits.astype(jnp.float32), axis=-1)
  return jnp.sum(jnp.exp(lp) * (lp - lq), axis=-1)


def _masked_mean(x, w):
  return jnp.sum(x * w) / jnp.maximum(jnp.sum(w), 1.0)


class Dynamics(nn.Module):
  """p_ψ as the authors build it (`NextLatDynamicsModel`): ĥ' = h + MLP(RMSNorm(concat[e, h])),
  a 3-layer bias-free MLP of width `hidden` with exact GELU, every matrix N(0, init_std)."""

  dims: layers.Dims
  hidden: int

  @nn.compact
  def __call__(self, h_BTD, e_BTD):
    d, f, std = self.dims.d_model, self.hidden, self.dims.init_std
    x = jnp.concatenate([e_BTD.astype(h_BTD.dtype), h_BTD], axis=-1)  # their order: token, then state
    x = layers.RMSNorm(self.dims.norm_eps, name="norm")(x)
    shapes = [(2 * d, f), (f, f), (f, d)]
    axes = [("embed", "mlp"), (None, "mlp"), ("mlp", "embed")]
    for j, (shape, ax) in enumerate(zip(shapes, axes)):
      x = layers.dense(x, self.param(f"w{j}", layers._init(std, ax), shape))
      if j < 2:
        x = jax.nn.gelu(x, approximate=False)  # torch nn.GELU(): erf, not tanh
    return h_BTD + x.astype(h_BTD.dtype)


class MTPHead(nn.Module):
  """Head i >= 2 of MTP: RMSNorm(h + W2 GELU(W1 h)), read by the shared head."""

  dims: layers.Dims

  @nn.compact
  def __call__(self, h_BTD):
    d, std = self.dims.d_model, self.dims.init_std
    w1 = self.param("w1", layers._init(std, ("embed", "mlp")), (d, self.dims.d_ff))
    w2 = self.param("w2", layers._init(std, ("mlp", "embed")), (self.dims.d_ff, d))
    x = h_BTD + layers.dense(jax.nn.gelu(layers.dense(h_BTD, w1)), w2)
    return layers.RMSNorm(self.dims.norm_eps, name="norm")(x)


class LatentLM(LM):
  """The standard LM (`transformer.LM`: its `embed`, `trunk`, `hidden` and head, so the shared
  KV-cache decoder reads the same parameter tree) plus `dynamics` (nextlat) or `mtp_heads` (mtp)."""

  kind: str = "nextlat"  # nextlat | gpt | mtp
  dyn_hidden: int = 0
  horizon: int = 1
  emb_grad: bool = True  # the latent losses' gradient reaches the token embedding fed to p_ψ
  latent: str = "final_norm"  # NextLat's h: final_norm | residual (latent_spec.LATENTS)

  def setup(self):
    super().setup()
    if self.kind == "nextlat":
      self.dynamics = Dynamics(self.dims, self.dyn_hidden, name="dynamics")
    if self.kind == "mtp":
      self.mtp_heads = [MTPHead(self.dims, name=f"mtp_head_{i}") for i in range(2, self.horizon + 1)]

  def latents(self, tokens_BT, segment_BT):
    """(z, h) [B, T, D]: NextLat's latent z (`latent`: the final-normed h itself, or the final
    residual stream before the norm) and the final-normed h the next-token head reads."""
    x = self.embedder.encode(tokens_BT)
    slots = attention.Slots(masks.Layout.causal(x.shape[1]), segment=segment_BT)
    r, h = self.trunk(nn.with_logical_constraint(x, ("batch", "length", "act_embed")), slots, with_residual=True)
    return (r if self.latent == "residual" else h), h

  def read(self, z_BTD, frozen: bool = False):
    """The vector the head reads for a latent z: z itself (`final_norm`), or the trunk's final
    RMSNorm applied to it (`residual`; `frozen`: its scale stop-gradient, part of p^sg)."""
    if self.latent != "residual":
      return z_BTD
    scale = nn.unbox(self.trunk.variables["params"]["final_norm"]["scale"])
    scale = sg(scale) if frozen else scale
    # The trunk's own norm module, applied with its (possibly frozen) scale; parent=None: a
    # detached copy (not a new submodule of this model, whose parameter tree stays the LM's).
    return layers.RMSNorm(self.dims.norm_eps, parent=None).apply({"params": {"scale": scale}}, z_BTD)

  def frozen_logits(self, z_BTD):
    """The head with its weights stop-gradient (L_KL's logits: theirs `F.linear(ĥ, W.detach())`)
    on `read(z)`, the final norm's scale frozen too for `residual` latents; the gradient still
    reaches z."""
    h_BTD = self.read(z_BTD, frozen=True)
    return layers.dense(h_BTD, sg(self.embedder.head_weight()), transpose_w=True, preferred_element_type=jnp.float32)

  def latent_logits(self, z_BTD):
    """Next-token logits read from a (predicted) latent: the head on `read(z)` (self-speculative
    drafting reads ĥ this way)."""
    return self.logits(self.read(z_BTD))

  def step(self, z_BTD, next_tokens_BT):
    """One dynamics step ĥ_{t+1} = p_ψ(h_t, x_{t+1}) in the latent space (self-speculative drafting)."""
    return self.dynamics(z_BTD, self.embedder.encode(next_tokens_BT))

  def __call__(self, tokens_BT, segment_BT):
    z, h = self.latents(tokens_BT, segment_BT)
    out = self.logits(h)
    if self.kind == "nextlat":
      out = out + 0 * self.latent_logits(self.step(z, tokens_BT))
    if self.kind == "mtp":
      for head in self.mtp_heads:
        out = out + 0 * self.logits(head(h))
    return out

  def losses(self, inputs_BT, targets_BT, seg_BT, weights_BT, lambda_h: float = 0.0, lambda_kl: float = 0.0):
    """(total loss, metrics) for one batch; see the module docstring."""
    z, h = self.latents(inputs_BT, seg_BT)  # z is h unless latent == "residual"
    ce, weight = cross_entropy.masked_cross_entropy(self.logits(h), targets_BT, weights_BT)
    metrics = {"weight": weight, "ce": ce}
    total = ce
    if self.kind == "nextlat":
      emb = self.embedder.encode(inputs_BT)
      if not self.emb_grad:
        emb = sg(emb)
      r = z
      lh_terms, kl_terms = [], []
      for i in range(1, self.horizon + 1):
        r = self.dynamics(r, shift_left(emb, i))  # ĥ_{t+i} from ĥ_{t+i-1} and emb(x_{t+i})
        target = sg(shift_left(z, i))
        valid = rollout_valid(seg_BT, i).astype(jnp.float32)
        lh_terms.append(_masked_mean(smooth_l1(r, target), valid))
        kl_w = valid * shift_left(weights_BT, i)
        kl_terms.append(_masked_mean(kl_logits(self.frozen_logits(target), self.frozen_logits(r)), kl_w))
      l_h, l_kl = sum(lh_terms) / self.horizon, sum(kl_terms) / self.horizon
      total = total + lambda_h * l_h + lambda_kl * l_kl
      metrics.update(next_h=l_h, kl=l_kl, next_h_last=lh_terms[-1], kl_last=kl_terms[-1])
    if self.kind == "mtp":
      ces = [ce]
      for i, head in enumerate(self.mtp_heads, start=2):
        w_i = shift_left(weights_BT, i - 1) * (seg_BT == shift_left(seg_BT, i - 1))
        ce_i, _ = cross_entropy.masked_cross_entropy(self.logits(head(h)), shift_left(targets_BT, i - 1), w_i)
        ces.append(ce_i)
        metrics[f"ce_head_{i}"] = ce_i
      total = sum(ces) / len(ces)
    return total, metrics


class LatentFamily(NextTokenFamily):
  """What NextLat and MTP share: the standard trunk and rule, prompt masking, and next-token
  logits read from the plain head (head 1; the dynamics model and extra heads only train)."""

  legacy_kept = ("data.answer_token",)

  @property
  def variant(self) -> str:
    return self.config.model.variant

  @property
  def rule(self) -> masks.Rule:
    return standard_rule(self.config.model.window)

  @property
  def answer_token(self) -> int:
    return answer_token(self.config)

  def trunk_flops_per_token(self, exclude: tuple[str, ...] = ()) -> float:
    """`train_flops_per_token` of the parameters outside `exclude` (top-level names), each used
    once per token; an untied input embedding is a lookup, not a product, so it is left out (a
    tied one is counted once, as the head)."""
    t = self.seq_len
    layout = masks.Layout.causal(t)
    pairs = masks.visible_pairs(masks.Rule(persistent_window=self.config.model.window), layout, layout)
    tree = nn.unbox(self.abstract_params())
    n = sum(int(np.prod(a.shape)) for k, sub in tree.items() if k not in exclude for a in jax.tree.leaves(sub))
    if not self.dims.tie_embeddings:
      n -= self.dims.vocab_size * self.dims.d_model
    return train_flops_per_token(n, pairs / t, self.dims.n_layers, self.dims.d_model)

  def token_logits(self, params, batch, *, model=None):
    """The next-token head's logits [B, T, V] (`Family.token_logits`): the logits of the CE term
    of `LatentLM.losses` (`ce`, what the eval step scores)."""
    return (model or self.model).apply({"params": params}, *self.model_inputs(batch),
                                       method=lambda m, t, s: m.logits(m.hidden(t, s)))


class NextLatFamily(LatentFamily):
  """NextLat (variant `nextlat`) and its GPT baseline with the same masking (variant `gpt`)."""

  name = "nextlat"
  hf_refusal = ("NextLat's trunk is Llama-like but its output head and latent dynamics model have no place in "
                "LlamaForCausalLM, and its self-speculative decoding needs them")
  variants = ("nextlat", "gpt")
  options = NextLatSpec
  legacy = {"model.nextlat": "*"}  # where configs written before `config.nextlat` held it (nsl.options.upgrade)

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    cls.options_of(config).check()  # every config.nextlat option

  @property
  def spec(self) -> NextLatSpec:
    return self.options_of(self.config).check()

  @property
  def horizon(self) -> int:
    return self.spec.horizon

  def decoder(self):
    """The shared KV-cache decoder; variant `nextlat` also drafts with its dynamics model p_ψ
    (`nsl.models.nextlat_decode.Decoder`, docs/papers/nextlat.md#speculative-decoding), its `gpt` baseline has none."""
    import dataclasses

    if self.variant != "nextlat":
      return super().decoder()

    def speculative(params, draft_len=None, temperature: float = 0.0):
      from nsl.models import nextlat_decode

      return nextlat_decode.Decoder(self, params, draft_len, temperature)

    return dataclasses.replace(super().decoder(), speculative=speculative)

  def make_model(self):
    kind = "nextlat" if self.variant == "nextlat" else "gpt"
    n = self.spec
    return LatentLM(self.dims, self.rule, kind=kind, dyn_hidden=n.hidden, horizon=n.horizon, emb_grad=n.emb_grad,
                    latent=n.latent)

  def loss(self, params, batch, rng, step):
    inputs, targets, seg_in, weights = task_targets(batch, self.answer_token)
    n = self.spec
    return self.model.apply({"params": params}, inputs, targets, seg_in, weights, n.lambda_h, n.lambda_kl,
                            method="losses")

  def flops_per_token(self) -> float:
    """Trunk as the standard family; plus per rollout step one dynamics pass (forward and both
    backward products) and L_KL's head reads: the teacher's forward, the student's forward and
    its input gradient (the head's weights are frozen there)."""
    base = self.trunk_flops_per_token(exclude=("dynamics",))
    if self.variant == "gpt":
      return base
    d, h = self.dims.d_model, self.spec.hidden
    dyn = 2 * d * h + h * h + h * d
    head = self.dims.vocab_size * d
    return base + self.horizon * (6.0 * dyn + 6.0 * head)


class MTPFamily(LatentFamily):
  """Multi-token prediction: `config.mtp.horizon` heads on the shared trunk."""

  name = "mtp"
  hf_refusal = "multi-token prediction adds extra heads that LlamaForCausalLM cannot hold"
  variants = ("mtp",)
  options = MTPSpec
  legacy = {"model.mtp": "*"}

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    cls.options_of(config).check()

  @property
  def horizon(self) -> int:
    return self.options_of(self.config).check().horizon

  def make_model(self):
    return LatentLM(self.dims, self.rule, kind="mtp", horizon=self.horizon)

  def loss(self, params, batch, rng, step):
    inputs, targets, seg_in, weights = task_targets(batch, self.answer_token)
    return self.model.apply({"params": params}, inputs, targets, seg_in, weights, method="losses")

  def flops_per_token(self) -> float:
    extra_heads = (self.horizon - 1) * self.dims.vocab_size * self.dims.d_model  # the shared head, reused
    return self.trunk_flops_per_token() + 6.0 * extra_heads
