"""The Family interface: what the trainer, describe mode and the records need from a model.

A family is everything that makes an architecture differ from the standard transformer and
nothing else (docs/design.md#families). The trainer only calls `init`, `loss`,
`eval_nll`, `dummy_batch`, `param_counts` and `flops_per_token`; it knows nothing about any
family. The evaluations (nsl/evals, the LIFT teacher) read a run only through `token_logits`,
`views` (`view_logits`), `rule`, `layout` and `with_rule`, everything that generates through `decoder()` (the
protocol of nsl/models/decoder.py), all declared here, so no caller asks what a family is.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from nsl.nn import cross_entropy, masks
from nsl.errors import ConfigError
from nsl.nn.layers import Dims


DEFAULT_VIEW = "own"  # the one view of a family that reads a row one way: its own forward


class Family:
  """Base class; subclasses set `name`, `variants`, and implement `make_model`, `model_inputs`,
  `loss`, `flops_per_token`, `rule` and `token_logits`."""

  name: str = ""
  variants: tuple[str, ...] = ()
  # Parameter names (last path component) counted as embedding parameters.
  embedding_params: tuple[str, ...] = ("embedding",)
  # Tokens of the dummy row `init` traces, when parameters do not depend on the row length and a
  # full-length trace is slow (describe builds them for every config); None: `data.seq_len`.
  init_len: int | None = None
  # The family's own options: a dataclass (`nsl.schema`) mounted at `config.<name>`, read typed
  # by `options_of`; None for a family with none. `legacy` maps where an option lived in configs
  # written before that mount (`"model.noise_density": "noise_density"`, "*" a whole section) to
  # its field, so older runs and config files read the same (`nsl.options.upgrade`).
  options: type | None = None
  legacy: dict[str, str] = {}
  # Fields of `legacy` that configs of then set only to change them: left out of a run id at their
  # default (`nsl.options.legacy_layout`), where the others are always in it.
  legacy_if_set: tuple[str, ...] = ()
  # Trunk fields this family's configs always carried before the base config held them (NextLat's
  # data.answer_token): kept in its run ids at their neutral value (`nsl.scaling.cells.NEUTRAL_FIELDS`).
  legacy_kept: tuple[str, ...] = ()

  def __init__(self, config):
    self.config = config
    self.dims = Dims.from_config(config)
    self.model = self.make_model()

  @classmethod
  def create(cls, config) -> "Family":
    """The family object of a validated config: `cls(config)`, or, for a variant that is another
    family (SPS's `standard`), that family's (`nsl.models.registry.get_family` calls this)."""
    return cls(config)

  @classmethod
  def options_of(cls, config):
    """`config.<name>` as the family's `options` dataclass, each field typed (`nsl.schema.read`)."""
    from nsl import schema

    return schema.read(cls.options, config[cls.name], cls.name)

  @classmethod
  def validate(cls, config) -> None:
    """Checks `config.model.variant`. A subclass checks its own options and calls
    `super().validate(config)` first, so each class's checks run exactly once."""
    if cls.variants and config.model.variant not in cls.variants:
      raise ConfigError(f"config.model.variant={config.model.variant!r} is not a variant of family "
                        f"{cls.name!r}; choose one of {cls.variants}")

  # Why the family's models have no Hugging Face architecture (`hugging_face`'s refusal).
  hf_refusal: str = "its model maps onto no transformers architecture"

  @classmethod
  def hugging_face(cls) -> str:
    """The Hugging Face architecture `nsl.hf` converts this family's runs to and from; a family
    without one raises a one-line ConfigError saying why (`hf_refusal`)."""
    raise ConfigError(f"family {cls.name!r} has no Hugging Face architecture: {cls.hf_refusal}; only a family "
                      "that maps onto one converts (nsl.hf: the standard family, LlamaForCausalLM)")

  # -- to implement -----------------------------------------------------------------------------
  def make_model(self) -> nn.Module:
    raise NotImplementedError

  def model_inputs(self, batch: dict[str, Any]) -> tuple:
    """Positional arguments of `model.apply` for initialisation from a batch."""
    raise NotImplementedError

  def loss(self, params, batch: dict[str, Any], rng, step) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(mean loss, metrics); metrics must include `weight`, the number of targets averaged."""
    raise NotImplementedError

  def flops_per_token(self) -> float:
    raise NotImplementedError

  @property
  def rule(self) -> masks.Rule:
    """The `masks.Rule` of the family's main attention (the trunk's; the context decoder's for
    the double decoder, the decoder's self attention for SED): what a probe such as
    `nsl.evals.persistent_window` starts from."""
    raise NotImplementedError

  def token_logits(self, params, batch: dict[str, Any], *, model: nn.Module | None = None,
                   **feed) -> jax.Array:
    """Next-token logits [B, T, V] at every input token of a batch of `seq_len + 1` tokens,
    aligned with `cross_entropy.next_token_targets(batch)`: row t predicts target t from inputs <= t
    (never later ones), whatever the family's layout. Packed rows are scored document by
    document. `model` is the family's model under another rule (`with_rule`), same parameters.

    Each family reads them where its own loss does: the standard trunk at every token, SPS at
    the read-out slots of its variant, NextLat/MTP from the next-token head, the double decoder
    from its generation decoder (under given or the eval step's blocks), SED from its decoder
    with the whole document as one masked span, LIFT under a state feed (`views`, default the
    one it uses at inference). `feed` holds these family-specific options."""
    raise NotImplementedError

  # -- evaluation views -------------------------------------------------------------------------
  def views(self) -> tuple[str, ...]:
    """The names of the family's logits views (`view_logits`), the first the default, the one it
    generates with: `("own",)` for a family that reads a row one way (LIFT: own, teacher, bias,
    the states fed). Evaluators and the trainer loop over these names and never spell them."""
    return (DEFAULT_VIEW,)

  def view(self, name: str | None, where: str = "view") -> str:
    """`name`, checked against `views()` (None: the default); a one-line ConfigError naming `where`."""
    if name is None:
      return self.views()[0]
    if name not in self.views():
      raise ConfigError(f"{where}={name}: family {self.name!r} has the views {list(self.views())}")
    return name

  def view_logits(self, params, batch: dict[str, Any], view: str, *, model: nn.Module | None = None) -> jax.Array:
    """`token_logits` under the named view (`views()`)."""
    self.view(view)
    return self.token_logits(params, batch, model=model)

  def view_suffix(self, view: str) -> str:
    """The suffix of a metric read under `view` (`eval_val_nll<suffix>`, result.json
    eval["val<suffix>"]): empty for the default view, else `_<view>` (LIFT: `_feed_<feed>`)."""
    return "" if view == self.views()[0] else f"_{view}"

  def eval_view(self) -> str:
    """The view the trainer's eval step (`eval_nll`) scores: the default one (LIFT: `lift.eval_feed`)."""
    return self.views()[0]

  def eval_nll(self, params, batch: dict[str, Any]) -> tuple[jax.Array, jax.Array]:
    """(sum of per-target NLL, number of targets): the trainer's eval step.

    The NLL is the loss's next-token cross-entropy: a family whose loss adds auxiliary terms
    (NextLat's latent losses, MTP's extra heads) reports it as metric `ce`, and that, not the
    total, is summed, so `eval_val_nll` compares across families. The loss runs with rng
    PRNGKey(0) at step 0 (the double decoder's blocks, SED's spans are drawn from it)."""
    loss, metrics = self.loss(params, batch, jax.random.PRNGKey(0), jnp.zeros((), jnp.int32))
    return metrics.get("ce", loss) * metrics["weight"], metrics["weight"]

  # -- generation -------------------------------------------------------------------------------
  # Why `decoder()` is None, for a family without one (the error of every caller that needs it).
  no_decoder: str = "its model has no left-to-right decoder"

  def decoder(self):
    """The family's `nsl.models.decoder.Decoder` (prefill, step, the whole-loop generate, a
    draft model), or None when it has no left-to-right decoder (docs/guide/decoding.md#generate)."""
    return None

  def slot_plan(self):
    """The `nsl.decode.SlotPlan` of the shared KV-cache decoder (docs/papers/sps.md#kv-cache); a
    family whose model is not the standard trunk has none: a one-line ConfigError."""
    raise ConfigError(f"family {self.name!r} has no KV-cache slot plan: its model is not the standard trunk "
                      "(its decoder, if any, is `Family.decoder()`)")

  def generate(self, params, prompt_BN, new_tokens: int, *, temperature: float = 0.0, rng=None):
    """`new_tokens` tokens after the prompt [B, N] (one document per row): (tokens [B, new_tokens]
    int32, logits [B, new_tokens, V]), logits[:, k] the distribution token k was drawn from
    (greedy at `temperature` 0), by the family's decoder (`decoder()`; none: a ConfigError)."""
    from nsl.models import decoder

    return decoder.require(self).generate(params, prompt_BN, new_tokens, temperature=temperature, rng=rng)

  def continuation_logits(self, params, batch: dict[str, Any], start_B: jax.Array) -> jax.Array:
    """`token_logits` of rows whose inputs before `start_B` [B] are a prompt and from `start_B` on
    its continuation (what lm-eval scores: the logits a decoder would give the continuation after
    that prompt). The same as `token_logits` for a family that reads a row one way; the double
    decoder makes the prompt its context and the continuation one block."""
    del start_B
    return self.token_logits(params, batch)

  # -- shared -----------------------------------------------------------------------------------
  def layout(self, num_tokens: int) -> masks.Layout:
    """Per-slot metadata (pos, tok, kind) of the main attention's slots for `num_tokens` tokens,
    in physical order: one persistent slot per token (SPS: two per token, its `layout`)."""
    return masks.Layout.causal(num_tokens)

  def with_rule(self, rule: masks.Rule) -> nn.Module:
    """The family's model (same parameter tree) with its main attention under another rule,
    e.g. a persistent-key window; pass it to `token_logits(..., model=...)`."""
    return self.model.clone(rule=rule)

  @property
  def seq_len(self) -> int:
    return int(self.config.data.seq_len)

  def dummy_batch(self, batch_size: int = 1) -> dict[str, jax.Array]:
    """A batch of the shape the data pipeline yields (extras come from families that need them)."""
    shape = (batch_size, self.seq_len + 1)
    return {"tokens": jnp.zeros(shape, jnp.int32), "segment": jnp.ones(shape, jnp.int32)}

  def init(self, rng) -> Any:
    """Parameters as a pytree of `nn.LogicallyPartitioned` boxes (unbox with `nn.unbox`), traced
    on a dummy row of `init_len` tokens when the family sets one."""
    batch = self.dummy_batch()
    if self.init_len is not None:
      batch = {k: v[:, : self.init_len + 1] for k, v in batch.items()}
    return self.model.init(rng, *self.model_inputs(batch))["params"]

  def abstract_params(self):
    return jax.eval_shape(self.init, jax.random.PRNGKey(0))

  def param_counts(self, abstract_params=None) -> dict[str, int]:
    """Total, embedding and non-embedding parameter counts (from shapes; no allocation)."""
    tree = nn.unbox(abstract_params if abstract_params is not None else self.abstract_params())
    total = emb = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      n = int(np.prod(leaf.shape))
      total += n
      if getattr(path[-1], "key", None) in self.embedding_params:
        emb += n
    return {"params_total": total, "params_embedding": emb, "params_non_embedding": total - emb}


def train_flops_per_token(matmul_params_per_token: float, attention_pairs_per_token: float,
                          n_layers: int, d_model: int) -> float:
  """Training FLOPs per token (docs/papers/scaling_laws.md#counting): 6 per matmul weight used per token
  (forward 2, backward 4), plus attention: QKᵀ and AV cost 4·d FLOPs per visible (q, k) pair per
  layer forward, ×3 for training, counting only visible pairs of the mask."""
  return 6.0 * matmul_params_per_token + 12.0 * n_layers * d_model * attention_pairs_per_token


class NextTokenFamily(Family):
  """A family whose model is called on (inputs, segment) of `cross_entropy.next_token_targets`
  and scores them with its own `cross_entropy(inputs, segment, targets, weights)` method: the
  standard trunk, SPS (whose model places the tokens in its slots itself) and the latent families'
  inputs."""

  def model_inputs(self, batch):
    inputs, _, seg_in, _ = cross_entropy.next_token_targets(batch)
    return inputs, seg_in

  def token_logits(self, params, batch, *, model: nn.Module | None = None):
    """The model's own logits [B, T, V] at its read-out positions (`Family.token_logits`)."""
    return (model or self.model).apply({"params": params}, *self.model_inputs(batch))

  def loss(self, params, batch, rng, step):
    inputs, targets, seg_in, weights = cross_entropy.next_token_targets(batch)
    loss, weight = self.model.apply({"params": params}, inputs, seg_in, targets, weights, method="cross_entropy")
    return loss, {"weight": weight}

  def slot_plan(self):
    """One persistent slot per token, read out at itself, under `rule` (SPS: its variant's slot groups)."""
    from nsl import decode

    return decode.SlotPlan(kinds=(masks.PERSISTENT,), readout=0, rule=self.rule)

  def decoder(self):
    """The shared KV-cache decoder over `slot_plan()` (`nsl.models.decoder.trunk_decoder`)."""
    from nsl.models import decoder

    return decoder.trunk_decoder(self)
