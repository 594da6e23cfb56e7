"""The standard decoder-only transformer: embed, the shared trunk, the tied head (docs/papers/sps.md#architecture)."""

from __future__ import annotations

import flax.linen as nn

from nsl.nn import attention, layers, masks
from nsl.models.family import NextTokenFamily, train_flops_per_token


def standard_rule(window: int | None) -> masks.Rule:
  """Causal + same document; an optional sliding window over the (all persistent) keys."""
  return masks.Rule(causal=True, same_segment=True, persistent_window=window)


class LM(nn.Module):
  """tokens [B, T], segment [B, T] -> final hidden states [B, T, D] and logits [B, T, V].

  The standard trunk every single-stream family builds on (NextLat/MTP's `LatentLM` and LIFT's
  `LiftLM` subclass it): the tied embedding `embed`, the `layers.Stack` `trunk`, the tied head."""

  dims: layers.Dims
  rule: masks.Rule

  def setup(self):
    self.embedder = layers.Embedder(self.dims, name="embed")
    self.trunk = layers.Stack(self.dims, self.rule, name="trunk")

  def hidden(self, tokens_BT, segment_BT):
    return self.trunk_hidden(self.embedder.encode(tokens_BT), segment_BT)

  def trunk_hidden(self, x_BTD, segment_BT):
    """The causal trunk over embedded inputs [B, T, D]: final hidden states (after the final norm)."""
    slots = attention.Slots(masks.Layout.causal(x_BTD.shape[1]), segment=segment_BT)
    return self.trunk(nn.with_logical_constraint(x_BTD, ("batch", "length", "act_embed")), slots)

  def logits(self, h_BTD):
    return self.embedder.decode(h_BTD)

  def __call__(self, tokens_BT, segment_BT):
    return self.logits(self.hidden(tokens_BT, segment_BT))

  def cross_entropy(self, tokens_BT, segment_BT, targets_BT, weights_BT):
    """`masked_cross_entropy` of `__call__`'s logits, through `Embedder.cross_entropy`."""
    return self.embedder.cross_entropy(self.hidden(tokens_BT, segment_BT), targets_BT, weights_BT)


class StandardFamily(NextTokenFamily):
  """The plain causal transformer over T tokens; logits at every token."""

  name = "standard"
  variants = ("standard",)

  @classmethod
  def hugging_face(cls) -> str:
    """LlamaForCausalLM: `nsl.hf` maps the trunk's parameters and checks the config's fields."""
    return "LlamaForCausalLM"

  @property
  def rule(self) -> masks.Rule:
    return standard_rule(self.config.model.window)

  def make_model(self):
    return LM(self.dims, self.rule)

  def decoder(self):
    """The shared KV-cache decoder; its benchmark times the SPS variants of this model side by
    side (`nsl.bench.decode.slot_variants`)."""
    import dataclasses

    return dataclasses.replace(super().decoder(), bench=SLOT_VARIANTS_BENCH)

  def flops_per_token(self) -> float:
    t = self.seq_len
    layout = masks.Layout.causal(t)
    pairs = masks.visible_pairs(masks.Rule(persistent_window=self.config.model.window), layout, layout)
    counts = self.param_counts()
    return train_flops_per_token(counts["params_total"], pairs / t, self.dims.n_layers, self.dims.d_model)


# `Decoder.bench` of the standard and SPS families: the SPS variants of the model side by side.
SLOT_VARIANTS_BENCH = "nsl.bench.decode:slot_variants"
