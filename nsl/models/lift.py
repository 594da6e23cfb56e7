"""LIFT: latent-state feedback with teacher supervision (docs/papers/lift.md#definitions).

Every input token is paired with a *state*: a distribution over the vocabulary that summarises
the previous position's prediction. It is projected through the tied embedding matrix and fused
with the token embedding; the model is trained to predict the next state as well as the next
token, and at inference feeds back its own predicted states, token by token, with a KV cache.

The paper's equations were not retrievable; this file implements the simplest reading of
docs/papers/lift.md#definitions, every choice configurable under `config.lift`:

- **State** of a logit vector z: keep the top-k logits (k = `lift.top_k`, 1024), softmax of
  z/τ over them (τ = `lift.temperature`, 1.5), zeros elsewhere (`state_from_logits`). The state
  made at position t (the prediction of target t) is fed to position t+1; the first position of
  every document gets a learned initial state vector instead (`init_state`, in embedding space).
- **Fusion** (`Fusion`): sE = s·E (E the tied embedding), z = [RMSNorm(e); RMSNorm(sE)],
  ẽ = e + W_down(SiLU(W_gate z) ⊙ W_up z); hidden h = `lift.fusion_hidden` (0: round(2.2 d)),
  so the fusion adds 5·d·h ≈ 11d² parameters (+ 2d norm scales, the initial state d, the
  dropout bias d).
- **Loss** (variant `lift`): CE + λ·KL(s_teacher,t ‖ q_t) with λ = `lift.kl_weight` (1.5). The
  forward KL is "top-k adapted": it sums only over the teacher state's support (s is zero
  elsewhere, 0·log 0 = 0); q = softmax(z_model/τ_kl) over the full vocabulary with
  τ_kl = `lift.kl_temperature` (default τ), so a model with KL → 0 reproduces the teacher's state
  from its own logits. The teacher is detached (stop_gradient).
- **Teacher states** (`lift.teacher`): `labels` = an oracle teacher whose next-state is the
  one-hot target (for synthetic tasks like S5, whose targets *are* the states; top-k and τ leave
  a one-hot unchanged); a run directory = a frozen nsl model (`nsl.models.teacher`), its
  states those it produces at inference, teacher-forced on the batch's tokens and computed on
  the fly: one parallel forward for a standard run, its own states fed back token by token with
  the KV cache, document by document, for a LIFT-family run (`token_logits(feed='own')`);
  `precomputed` = top-k indices and
  values carried by the batch (`teacher_idx`, `teacher_val`; `python -m nsl.models.teacher
  precompute`).
- **Prefix state dropout** (`lift.state_dropout` = p): with probability p per sequence, the
  sequence's fed states (`lift.dropout_mode='sequence'`: all of them, including the initial
  one; `'prefix'`: a uniformly random-length prefix) are replaced by a learned bias b (in the
  state-embedding space), so prompts can be prefilled in parallel with b.
- **Self-state adaptation**: from step ceil((1 - `lift.adapt_fraction`)·train.steps) on (last
  10%), no teacher and no KL; n extra no-gradient forward passes make the model's own states,
  n ∈ {0, 1, 2} with probabilities `lift.adapt_pass_probs` = (0.5, 0.25, 0.25) (our reading of
  "with probability 0.5 run 1–2 extra passes"); pass 1 is fed the seed states, pass i+1 the
  states of pass i; the trained pass is fed the last ones (the seed when n = 0). Decided inside
  the loss with `lax.cond` / `lax.switch` on `step`. The seed (`lift.adapt_seed`) is b
  everywhere (`bias`, the literal reading: no teacher at all) or the teacher's states
  (`teacher`: the teacher only seeds the first pass; no KL). On S5 a `bias` seed leaves every
  state past the first few positions wrong (one pass fixes about one more position, a parallel
  Jacobi sweep of the sequential feedback), so the model learns to distrust its channel; the
  `teacher` seed keeps the passes near the states the model will feed itself.

Variants: `lift` (above); `lift_no_states` (the same parameters, channel off: every fed state is
b; CE only); `distill` (no fusion, no channel: a standard transformer with CE + λ·KL to the
teacher); `lift_rnn` (sequential feedback of the model's own states during training: a
no-gradient cached pass, exactly inference, produces the states the gradient pass is fed;
CE + λ·KL when a teacher is set; for small models — T sequential steps per batch). That pass
respects packed documents exactly like the parallel forward: the initial state at every
document start, no attention across documents (`rnn_fed_states`).

Inference: `feedback_logits` runs teacher-forced tokens with own-state feedback and a KV cache,
packed rows document by document (`recompute_feedback_logits` is the O(T) reference that reruns
the full prefix per token); `generate` decodes greedily.

Evaluation (`token_logits` / `eval_nll`, EVAL_FEEDS): `own` = the states the run feeds itself at
inference (own states for lift and lift_rnn, b for lift_no_states; the paper's metric),
`teacher` = the teacher's states in parallel, `bias` = b. The trainer's eval is
`lift.eval_feed` (own: `eval_val_nll`; another feed: `eval_val_nll_feed_<feed>`), and
`python -m nsl.evals.nll --view` records each feed (a view, `LiftFamily.views`) under its own key.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from nsl import decode, schema
from nsl.errors import ConfigError
from nsl.nn import cross_entropy, kv_cache, layers, masks
from nsl.models.family import Family, train_flops_per_token
from nsl.models.transformer import LM, standard_rule

VARIANTS = ("lift", "lift_no_states", "distill", "lift_rnn")
DROPOUT_MODES = ("sequence", "prefix")
ADAPT_SEEDS = ("bias", "teacher")
EVAL_FEEDS = ("own", "teacher", "bias")  # `LiftFamily.token_logits` and its views (`nsl.evals.nll --view`)


# -- definitions --------------------------------------------------------------------------------
def state_from_logits(logits_V, top_k: int, temperature: float):
  """Top-k temperature softmax scattered back to the vocabulary: float32 [..., V], <= k non-zeros."""
  logits_V = logits_V.astype(jnp.float32)
  k = min(int(top_k), logits_V.shape[-1])
  if k == logits_V.shape[-1]:  # the whole vocabulary: no sort, no scatter (S5 decodes with this)
    return jax.nn.softmax(logits_V / temperature, axis=-1)
  vals, idx = jax.lax.top_k(logits_V, k)
  probs = jax.nn.softmax(vals / temperature, axis=-1)
  return scatter_topk(idx, probs, logits_V.shape[-1])


def state_embedding(logits_BV, top_k: int, temperature: float, embedding_VD):
  """s·E for the state s = `state_from_logits(logits, top_k, temperature)` [B, V] of each row:
  with k < V the sum of the k kept rows of E weighted by their probabilities (a gather of k rows;
  the dense s @ E reads all of E, 103 MB at V = 50,304 and d = 512, once more per decoded token)."""
  logits_BV = logits_BV.astype(jnp.float32)
  emb = jnp.asarray(embedding_VD, jnp.float32)  # a loaded teacher's parameters may be numpy arrays
  k = min(int(top_k), logits_BV.shape[-1])
  if k == logits_BV.shape[-1]:
    return jax.nn.softmax(logits_BV / temperature, axis=-1) @ emb
  vals, idx = jax.lax.top_k(logits_BV, k)
  return jnp.einsum("bk,bkd->bd", jax.nn.softmax(vals / temperature, axis=-1), jnp.take(emb, idx, axis=0))


def scatter_topk(idx_K, val_K, vocab_size: int):
  """[..., k] indices and values -> dense [..., V] (the precomputed-shard representation)."""
  lead = idx_K.shape[:-1]
  flat_i = idx_K.reshape(-1, idx_K.shape[-1])
  flat_v = val_K.reshape(-1, val_K.shape[-1]).astype(jnp.float32)
  out = jnp.zeros((flat_i.shape[0], vocab_size), jnp.float32)
  out = out.at[jnp.arange(flat_i.shape[0])[:, None], flat_i].add(flat_v)
  return out.reshape(lead + (vocab_size,))


def topk_forward_kl(teacher_BTV, logits_BTV, temperature: float, weights_BT):
  """Mean over weighted positions of Σ_v s_v (log s_v - log softmax(z/τ)_v), summed only over the
  teacher's support (s_v > 0)."""
  logq = jax.nn.log_softmax(logits_BTV.astype(jnp.float32) / temperature, axis=-1)
  s = jax.lax.stop_gradient(teacher_BTV.astype(jnp.float32))
  pos = s > 0
  kl = jnp.sum(jnp.where(pos, s * (jnp.log(jnp.where(pos, s, 1.0)) - logq), 0.0), axis=-1)
  return jnp.sum(kl * weights_BT) / jnp.maximum(jnp.sum(weights_BT), 1.0)


def shift_states(state_BTD, init_D, segment_BT):
  """Fed state embedding at t: the state made at t-1, or `init_D` at a document's first position."""
  prev = jnp.concatenate([jnp.zeros_like(state_BTD[:, :1]), state_BTD[:, :-1]], axis=1)
  first = jnp.concatenate([jnp.ones_like(segment_BT[:, :1], bool), segment_BT[:, 1:] != segment_BT[:, :-1]], axis=1)
  return jnp.where(first[..., None], init_D.astype(state_BTD.dtype), prev)


def dropout_mask(rng, batch: int, length: int, p: float, mode: str):
  """[B, T] bool: positions whose fed state is replaced by the bias b (prefix state dropout)."""
  k1, k2 = jax.random.split(rng)
  drop_B = jax.random.bernoulli(k1, p, (batch,))
  if mode == "sequence":
    return jnp.broadcast_to(drop_B[:, None], (batch, length))
  prefix_B = jax.random.randint(k2, (batch,), 1, length + 1)
  return drop_B[:, None] & (jnp.arange(length)[None, :] < prefix_B[:, None])


@dataclasses.dataclass(frozen=True)
class LiftOptions:
  """`config.lift` (nsl.schema): LIFT's options (docs/papers/lift.md#definitions)."""

  top_k: int = 1024
  temperature: float = 1.5
  kl_weight: float = 1.5
  kl_temperature: float = 0.0  # 0 = temperature
  fusion_hidden: int = 0  # 0 = round(2.2 d): ≈ 11 d² fusion parameters
  state_dropout: float = 0.0
  dropout_mode: str = "sequence"
  adapt_fraction: float = 0.1
  adapt_pass_probs: tuple[float, ...] = (0.5, 0.25, 0.25)
  adapt_seed: str = "bias"  # what the first no-gradient pass is fed: bias | teacher
  teacher: str = "labels"  # labels | precomputed | <run dir>
  eval_feed: str = "own"  # the trainer's eval (EVAL_FEEDS): own -> eval_val_nll, else eval_val_nll_feed_<feed>


@dataclasses.dataclass(frozen=True)
class LiftSpec(LiftOptions):
  """The static LIFT hyper-parameters (hashable): `config.lift` and the variant."""

  variant: str = "lift"

  @property
  def has_channel(self) -> bool:
    return self.variant != "distill"

  @property
  def kl_tau(self) -> float:
    return self.kl_temperature or self.temperature

  def hidden(self, d: int) -> int:
    return self.fusion_hidden or int(round(2.2 * d))

  @staticmethod
  def from_config(config) -> "LiftSpec":
    options = schema.read(LiftOptions, config.lift, "lift")
    return LiftSpec(variant=config.model.variant, **dataclasses.asdict(options))


def default_lift_config():
  """The `config.lift` section with the paper's defaults (docs/papers/lift.md#definitions); the
  base config holds it (nsl.schema), so a LIFT config need not add it."""
  return schema.section(LiftOptions)


# -- modules ------------------------------------------------------------------------------------
class Fusion(nn.Module):
  """ẽ = e + W_down(SiLU(W_gate z) ⊙ W_up z), z = [RMSNorm(e); RMSNorm(sE)]."""

  dims: layers.Dims
  hidden: int

  @nn.compact
  def __call__(self, e_BTD, se_BTD):
    d, h, std = self.dims.d_model, self.hidden, self.dims.init_std
    z = jnp.concatenate([layers.RMSNorm(self.dims.norm_eps, name="token_norm")(e_BTD),
                         layers.RMSNorm(self.dims.norm_eps, name="state_norm")(se_BTD.astype(e_BTD.dtype))], -1)
    init = lambda s, axes: nn.with_logical_partitioning(nn.initializers.normal(stddev=s), axes)
    w_gate = self.param("w_gate", init(std, (None, "mlp")), (2 * d, h))
    w_up = self.param("w_up", init(std, (None, "mlp")), (2 * d, h))
    w_down = self.param("w_down", init(std / math.sqrt(2 * self.dims.n_layers), ("mlp", "embed")), (h, d))
    return e_BTD + layers.dense(jax.nn.silu(layers.dense(z, w_gate)) * layers.dense(z, w_up), w_down)


class LiftLM(LM):
  """tokens [B, T], segment [B, T], fed state embeddings [B, T, D] (or None) -> logits [B, T, V]:
  the standard LM (`transformer.LM`: `embed`, `trunk`, tied head) with the state channel fused
  into its input embedding."""

  spec: LiftSpec

  def setup(self):
    d = self.dims.d_model
    super().setup()
    if self.spec.has_channel:
      self.fusion = Fusion(self.dims, self.spec.hidden(d), name="fusion")
      vec = lambda: nn.with_logical_partitioning(nn.initializers.normal(stddev=self.dims.init_std), ("embed",))
      self.init_state = self.param("init_state", vec(), (d,))
      self.state_bias = self.param("state_bias", vec(), (d,))

  def state_embedding(self, probs_BTV):
    """s·E in float32 (the state's expected token embedding)."""
    return layers.dense(probs_BTV.astype(jnp.float32), self.embedder.embedding)

  def fed_states(self, probs_BTV, segment_BT, drop_BT=None):
    """The fed state embedding per position: shifted states, initial state, bias where dropped."""
    se = shift_states(self.state_embedding(probs_BTV), self.init_state, segment_BT)
    if drop_BT is not None:
      se = jnp.where(drop_BT[..., None], self.state_bias.astype(se.dtype), se)
    return se

  def bias_states(self, shape_BT):
    return jnp.broadcast_to(self.state_bias.astype(jnp.float32), shape_BT + (self.dims.d_model,))

  def embed(self, tokens_BT, fed_BTD=None):
    e = self.embedder.encode(tokens_BT)
    if self.spec.has_channel:
      e = self.fusion(e, fed_BTD)
    return e

  def hidden(self, tokens_BT, segment_BT, fed_BTD=None):
    return self.trunk_hidden(self.embed(tokens_BT, fed_BTD), segment_BT)

  def __call__(self, tokens_BT, segment_BT, fed_BTD=None):
    if self.spec.has_channel and fed_BTD is None:
      fed_BTD = self.bias_states(tokens_BT.shape)
    return self.logits(self.hidden(tokens_BT, segment_BT, fed_BTD))


# -- KV-cache inference with own-state feedback -------------------------------------------------
def _cached_step(dims: layers.Dims, model: LiftLM, params, cache, tok_B, fed_BD, t, seg_BT):
  """Position t of every row through the shared cached trunk (`nsl.decode.trunk`, the model's
  `layers.Stack` with a `kv_cache.KVCache`); -> (logits [B, V], cache).

  Visibility is the model's rule on per-slot metadata (causal, same document `seg_BT[:, t]`, the
  persistent window when set), exactly the parallel forward's. RoPE positions are row positions
  as in the parallel forward; attention only sees their differences, so a document's logits do
  not depend on where it starts in the row."""
  x = model.apply({"params": params}, tok_B[:, None], None if fed_BD is None else fed_BD[:, None], method=LiftLM.embed)
  t1 = jnp.reshape(jnp.asarray(t, jnp.int32), (1,))
  seg_B1 = jax.lax.dynamic_slice_in_dim(seg_BT, t, 1, axis=1)
  step = cache.step(t1, t1, jnp.full((1,), masks.PERSISTENT, jnp.int32), seg_B1)
  cache, h = decode.trunk(dims, model.rule, params, x, cache, step)
  return model.apply({"params": params}, h, method=LiftLM.logits)[:, 0], cache


def _own_state_scan(dims, spec, model, params, tokens_BT, choose_token=None, feed: str = "own", segment_BT=None):
  """Sequential decode: position t is fed the state of the logits at t-1 (own) or b (bias); the
  first position of every document (a change of `segment_BT`, default one document per row) is
  fed the learned initial state (own) or b and sees only its own document's cache. The token
  loop runs the layers unrolled on per-layer weights and K/V (`KVCache.per_layer`,
  `decode.token_loop_params`), like `nsl.decode.decode_loop`."""
  B, T = tokens_BT.shape
  cache = kv_cache.KVCache.create(dims, B, T).per_layer()
  seg = jnp.ones((B, T), jnp.int32) if segment_BT is None else jnp.asarray(segment_BT, jnp.int32)
  p = decode.token_loop_params(dims, params)
  d = dims.d_model

  if spec.has_channel:
    first = jnp.broadcast_to((p["init_state"] if feed == "own" else p["state_bias"]).astype(jnp.float32), (B, d))
  else:
    first = jnp.zeros((B, d), jnp.float32)

  def body(carry, t):
    cache, fed, prev_tok = carry
    tok = tokens_BT[:, t] if choose_token is None else choose_token(t, prev_tok)
    seg_t = jax.lax.dynamic_index_in_dim(seg, t, axis=1, keepdims=False)
    seg_prev = jax.lax.dynamic_index_in_dim(seg, jnp.maximum(t - 1, 0), axis=1, keepdims=False)
    fed = jnp.where(((t == 0) | (seg_t != seg_prev))[:, None], first, fed)
    logits, cache = _cached_step(dims, model, p, cache, tok, fed if spec.has_channel else None, t, seg)
    if spec.has_channel:
      fed = (state_embedding(logits, spec.top_k, spec.temperature, p["embed"]["embedding"]) if feed == "own"
             else jnp.broadcast_to(p["state_bias"].astype(jnp.float32), (B, d)))
    return (cache, fed, decode.argmax(logits).astype(tokens_BT.dtype)), (logits, tok)

  _, (logits_TBV, toks_TB) = jax.lax.scan(body, (cache, first, tokens_BT[:, 0]), jnp.arange(T))
  return jnp.swapaxes(logits_TBV, 0, 1), jnp.swapaxes(toks_TB, 0, 1)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 5, 6))
def _generate(dims, spec, model, params, prompt_BP, new_tokens: int, feed: str = "own"):
  """`LiftFamily.greedy` (its `Decoder.generate`), one compiled program per shape: the prompt's tokens are fed in order,
  then each argmax token, with the run's inference feed (own states, or b for lift_no_states)."""
  B, P = prompt_BP.shape
  padded = jnp.concatenate([prompt_BP, jnp.zeros((B, new_tokens), prompt_BP.dtype)], axis=1)
  choose = lambda t, prev: jnp.where(t < P, padded[:, t], prev)
  logits, toks = _own_state_scan(dims, spec, model, params, padded, choose_token=choose, feed=feed)
  return toks[:, P:], logits[:, P - 1:-1]


# -- the family ---------------------------------------------------------------------------------
class LiftFamily(Family):
  """LIFT and its baselines (module docstring). Batches may carry `labels` (task data) and, for
  `lift.teacher='precomputed'`, `teacher_idx` / `teacher_val` [B, T+1, k]."""

  name = "lift"
  hf_refusal = ("LIFT fuses each token's embedding with a fed-back next-token distribution (a state channel); "
                "Llama has no such input")
  variants = VARIANTS
  options = LiftOptions

  def __init__(self, config):
    self.spec = LiftSpec.from_config(config)
    super().__init__(config)
    self._teacher = None

  @classmethod
  def validate(cls, config) -> None:
    super().validate(config)
    s = LiftSpec.from_config(config)
    if s.top_k <= 0:
      raise ConfigError(f"config.lift.top_k={s.top_k} must be positive")
    if s.temperature <= 0 or s.kl_temperature < 0:
      raise ConfigError("config.lift.temperature must be positive and lift.kl_temperature >= 0")
    if not 0.0 <= s.state_dropout <= 1.0:
      raise ConfigError(f"config.lift.state_dropout={s.state_dropout} must be in [0, 1]")
    if s.dropout_mode not in DROPOUT_MODES:
      raise ConfigError(f"config.lift.dropout_mode={s.dropout_mode!r} must be one of {DROPOUT_MODES}")
    if not 0.0 <= s.adapt_fraction < 1.0:
      raise ConfigError(f"config.lift.adapt_fraction={s.adapt_fraction} must be in [0, 1)")
    if len(s.adapt_pass_probs) != 3 or abs(sum(s.adapt_pass_probs) - 1) > 1e-6 or min(s.adapt_pass_probs) < 0:
      raise ConfigError("config.lift.adapt_pass_probs must be 3 probabilities (0, 1, 2 passes) summing to 1")
    if s.adapt_seed not in ADAPT_SEEDS:
      raise ConfigError(f"config.lift.adapt_seed={s.adapt_seed!r} must be one of {ADAPT_SEEDS}")
    if s.eval_feed not in EVAL_FEEDS:
      raise ConfigError(f"config.lift.eval_feed={s.eval_feed!r} must be one of {EVAL_FEEDS}")
    if s.eval_feed == "teacher" and not s.teacher:
      raise ConfigError("config.lift.eval_feed='teacher' needs config.lift.teacher")
    if not s.teacher and s.variant in ("lift", "distill"):
      raise ConfigError(f"config.lift.teacher is empty but variant {s.variant!r} needs one: 'labels', "
                        "'precomputed' or a teacher run directory")

  @property
  def rule(self) -> masks.Rule:
    return standard_rule(self.config.model.window)

  def make_model(self):
    return LiftLM(self.dims, self.rule, self.spec)

  def model_inputs(self, batch):
    inputs, _, seg_in, _ = cross_entropy.next_token_targets(batch)
    fed = jnp.zeros(inputs.shape + (self.dims.d_model,), jnp.float32) if self.spec.has_channel else None
    return inputs, seg_in, fed

  def dummy_batch(self, batch_size: int = 1):
    b = super().dummy_batch(batch_size)
    if self.spec.teacher == "precomputed":
      k = min(self.spec.top_k, self.dims.vocab_size)
      b["teacher_idx"] = jnp.zeros(b["tokens"].shape + (k,), jnp.int32)
      b["teacher_val"] = jnp.zeros(b["tokens"].shape + (k,), jnp.float32)
    return b

  # -- teacher states ---------------------------------------------------------------------------
  @property
  def teacher(self):
    if self._teacher is None and self.spec.teacher not in ("", "labels", "precomputed"):
      import concurrent.futures

      from nsl.models import teacher as teacher_lib

      def load():
        t = teacher_lib.Teacher.load(self.spec.teacher, self.config)
        t.params = jax.device_get(t.params)  # host constants of the student's step, on any mesh
        return t

      # First used inside the traced loss, under the trainer's mesh: a fresh thread restores the
      # checkpoint outside that trace and mesh context (both are thread-local), eagerly.
      with concurrent.futures.ThreadPoolExecutor(1) as pool:
        self._teacher = pool.submit(load).result()
    return self._teacher

  def teacher_states(self, batch, targets_BT, weights_BT):
    """s_teacher,t [B, T, V]: the teacher's state at each input position (its prediction of target t)."""
    s, V = self.spec, self.dims.vocab_size
    if s.teacher == "labels":
      return jax.nn.one_hot(targets_BT, V, dtype=jnp.float32) * weights_BT[..., None]
    if s.teacher == "precomputed":
      return scatter_topk(batch["teacher_idx"][:, :-1], batch["teacher_val"][:, :-1], V)
    logits = self.teacher.logits(batch)
    if logits.shape[-1] < V:
      logits = jnp.pad(logits, ((0, 0), (0, 0), (0, V - logits.shape[-1])), constant_values=-jnp.inf)
    return jax.lax.stop_gradient(state_from_logits(logits[..., :V], s.top_k, s.temperature))

  # -- loss -------------------------------------------------------------------------------------
  def adapt_start(self) -> int:
    steps = int(self.config.train.steps)
    return steps if self.spec.adapt_fraction == 0 else int(math.ceil((1.0 - self.spec.adapt_fraction) * steps))

  def own_states(self, params, inputs, seg_in, fed):
    """One no-gradient pass: the states of the model's own logits when fed `fed`."""
    logits = self.model.apply({"params": params}, inputs, seg_in, fed)
    return jax.lax.stop_gradient(state_from_logits(logits, self.spec.top_k, self.spec.temperature))

  def fed(self, params, probs, seg_in, drop=None):
    return self.model.apply({"params": params}, probs, seg_in, drop, method=LiftLM.fed_states)

  def rnn_fed_states(self, params, inputs, seg_in, model=None):
    """LIFT-RNN's fed states: one no-gradient cached pass, exactly inference (own states fed back
    token by token, the initial state at every document start, no attention across documents),
    whose states the parallel gradient pass is fed (shifted, the initial state at document starts)."""
    s = self.spec
    sg = jax.lax.stop_gradient(params)
    own, _ = _own_state_scan(self.dims, s, model or self.model, sg, inputs, segment_BT=seg_in)
    probs = jax.lax.stop_gradient(state_from_logits(own, s.top_k, s.temperature))
    return self.fed(params, probs, seg_in)

  def loss(self, params, batch, rng, step):
    s = self.spec
    inputs, targets, seg_in, weights = cross_entropy.next_token_targets(batch)
    apply = lambda fed: self.model.apply({"params": params}, inputs, seg_in, fed)
    ce = lambda logits: cross_entropy.masked_cross_entropy(logits, targets, weights)
    B, T = inputs.shape
    bias = self.model.apply({"params": params}, (B, T), method=LiftLM.bias_states) if s.has_channel else None

    if s.variant == "lift_no_states":
      loss, w = ce(apply(bias))
      return loss, {"weight": w, "ce": loss}

    if s.variant == "distill":
      logits = apply(None)
      loss, w = ce(logits)
      kl = topk_forward_kl(self.teacher_states(batch, targets, weights), logits, s.kl_tau, weights)
      return loss + s.kl_weight * kl, {"weight": w, "ce": loss, "kl": kl}

    if s.variant == "lift_rnn":
      logits = apply(self.rnn_fed_states(params, inputs, seg_in))
      loss, w = ce(logits)
      metrics = {"weight": w, "ce": loss}
      if s.teacher:
        kl = topk_forward_kl(self.teacher_states(batch, targets, weights), logits, s.kl_tau, weights)
        metrics["kl"] = kl
        loss = loss + s.kl_weight * kl
      return loss, metrics

    # lift: teacher phase, then self-state adaptation over the last adapt_fraction of steps.
    k_drop, k_pass = jax.random.split(rng)
    drop = dropout_mask(k_drop, B, T, s.state_dropout, s.dropout_mode) if s.state_dropout > 0 else None

    def teacher_phase(_):
      t_states = self.teacher_states(batch, targets, weights)
      logits = apply(self.fed(params, t_states, seg_in, drop))
      loss, w = ce(logits)
      kl = topk_forward_kl(t_states, logits, s.kl_tau, weights)
      return loss + s.kl_weight * kl, loss, kl, w

    def adapt_phase(_):
      sg = jax.lax.stop_gradient(params)
      own = lambda fed: jax.lax.stop_gradient(self.fed(sg, self.own_states(sg, inputs, seg_in, fed), seg_in))
      if s.adapt_seed == "teacher":
        seed = jax.lax.stop_gradient(self.fed(sg, self.teacher_states(batch, targets, weights), seg_in))
      else:
        seed = jax.lax.stop_gradient(bias)
      n = jax.random.choice(k_pass, 3, p=jnp.asarray(s.adapt_pass_probs))
      fed = jax.lax.switch(n, [lambda: seed, lambda: own(seed), lambda: own(own(seed))])
      loss, w = ce(apply(fed))
      return loss, loss, jnp.zeros((), jnp.float32), w

    if s.adapt_fraction > 0:
      total, loss, kl, w = jax.lax.cond(step >= self.adapt_start(), adapt_phase, teacher_phase, None)
    else:
      total, loss, kl, w = teacher_phase(None)
    return total, {"weight": w, "ce": loss, "kl": kl}

  # -- inference --------------------------------------------------------------------------------
  def feedback_logits(self, params, tokens_BT, feed: str = "own", segment_BT=None, model=None):
    """Teacher-forced tokens, fed the model's own states (`feed='own'`) or b (`'bias'`), with a
    KV cache: logits [B, T, V]. `segment_BT` (default: one document per row) splits packed rows
    into documents, each decoded as if alone (initial state, no attention across documents)."""
    logits, _ = _own_state_scan(self.dims, self.spec, model or self.model, params, tokens_BT, feed=feed,
                                segment_BT=segment_BT)
    return logits

  @property
  def inference_feed(self) -> str:
    """What this run feeds itself at inference: its own states (lift, lift_rnn); b for
    lift_no_states (the ablation is trained and used with the channel off); nothing for distill."""
    return {"lift_no_states": "bias", "distill": "none"}.get(self.spec.variant, "own")

  @property
  def decode_feed(self) -> str:
    """`_own_state_scan`'s feed for `inference_feed`: 'bias' for lift_no_states, else 'own'
    (distill has no channel, so its feed is unused)."""
    return "bias" if self.inference_feed == "bias" else "own"

  def token_logits(self, params, batch, *, model=None, feed: str = "own"):
    """Next-token logits [B, T, V] aligned with `cross_entropy.next_token_targets(batch)`, packed rows
    document by document, under a state feed (EVAL_FEEDS):
      own      the states the run feeds itself at inference (`inference_feed`): for lift and
               lift_rnn its own states fed back sequentially with the KV cache; the paper's
               metric, and what a LIFT-family teacher produces (`nsl.models.teacher`);
      teacher  the teacher's states fed in parallel (the teacher phase of training, no dropout);
      bias     b at every position (channel off; parallel).
    distill has no channel: every feed is the plain forward."""
    if feed not in EVAL_FEEDS:
      raise ConfigError(f"feed={feed!r} must be one of {EVAL_FEEDS}")
    inputs, targets, seg_in, weights = cross_entropy.next_token_targets(batch)
    m = model or self.model
    apply = lambda fed: m.apply({"params": params}, inputs, seg_in, fed)
    if not self.spec.has_channel:
      return apply(None)
    if feed == "own":
      feed = self.inference_feed
    if feed == "own":
      return self.feedback_logits(params, inputs, "own", seg_in, m)
    if feed == "teacher":
      if not self.spec.teacher:
        raise ConfigError(f"feed='teacher': run of variant {self.spec.variant!r} has no teacher (config.lift.teacher)")
      return apply(self.fed(params, self.teacher_states(batch, targets, weights), seg_in))
    return apply(None)  # b everywhere

  def views(self) -> tuple[str, ...]:
    """`Family.views`: the state feeds (EVAL_FEEDS: own, teacher, bias), own the default."""
    return EVAL_FEEDS

  def view_logits(self, params, batch, view: str, *, model=None):
    """`token_logits` with the states of feed `view`."""
    return self.token_logits(params, batch, model=model, feed=self.view(view))

  def view_suffix(self, view: str) -> str:
    """eval_val_nll (result.json eval.val) is the own-state NLL, another feed's is
    eval_val_nll_feed_<feed> (eval.val_feed_<feed>), as the keys of `nsl.evals.nll --view`."""
    return "" if view == "own" else f"_feed_{view}"

  def eval_view(self) -> str:
    """`lift.eval_feed`, what the trainer's eval step scores (`eval_nll`)."""
    return self.spec.eval_feed

  def eval_nll(self, params, batch, feed: str | None = None):
    """(sum of per-target NLL, number of targets) under a state feed (`token_logits`; default
    `lift.eval_feed`, what the trainer's eval logs)."""
    feed = feed or self.spec.eval_feed
    _, targets, _, weights = cross_entropy.next_token_targets(batch)
    ce, w = cross_entropy.masked_cross_entropy(self.token_logits(params, batch, feed=feed), targets, weights)
    return ce * w, w

  def recompute_feedback_logits(self, params, tokens_BT):
    """Reference for `feedback_logits`: for t = 1..T rerun the whole prefix in parallel, fed the
    states of the previous run's logits (after T runs every position saw its own prefix's states)."""
    B, T = tokens_BT.shape
    seg = jnp.ones_like(tokens_BT)
    if not self.spec.has_channel:
      return self.model.apply({"params": params}, tokens_BT, seg, None)
    probs = jnp.zeros((B, T, self.dims.vocab_size), jnp.float32)
    for _ in range(T):
      logits = self.model.apply({"params": params}, tokens_BT, seg, self.fed(params, probs, seg))
      probs = state_from_logits(logits, self.spec.top_k, self.spec.temperature)
    return logits

  def decoder(self):
    """One compiled loop, `greedy` (no token-at-a-time form: each position's state comes from the
    previous one's logits inside the loop), timed beside its trunk without states
    (`nsl.bench.lift_decode`)."""
    from nsl.models.decoder import Decoder

    return Decoder(generate=self.greedy, bench="nsl.bench.lift_decode:bench")

  def greedy(self, params, prompt_BP, new_tokens: int, *, temperature: float = 0.0, rng=None):
    """Greedy decoding with own-state feedback (the inference rule, docs/papers/lift.md#variants): the
    prompt's tokens are fed in order (its states are the model's own too), then each argmax
    token, through the cached trunk; lift_no_states is fed b instead (`inference_feed`).
    -> (tokens [B, new_tokens], logits [B, new_tokens, V]), logits[:, k] those token k is the
    argmax of. Greedy only: `temperature` > 0 is a ConfigError."""
    if temperature:
      raise ConfigError(f"LIFT's own-state feedback decode is greedy only; got temperature={temperature}, use 0")
    if new_tokens < 1:
      raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    return _generate(self.dims, self.spec, self.model, params, jnp.asarray(prompt_BP, jnp.int32), int(new_tokens),
                     self.decode_feed)

  def flops_per_token(self) -> float:
    """6 × (parameters + V·d for s·E when the channel is on) + visible attention; the teacher's
    forward (2 × its parameters) is not counted; lift_rnn's sequential pass is counted as one
    extra forward (2 × parameters)."""
    t = self.seq_len
    layout = masks.Layout.causal(t)
    pairs = masks.visible_pairs(masks.Rule(persistent_window=self.config.model.window), layout, layout)
    n = self.param_counts()["params_total"]
    matmul = n + (self.dims.vocab_size * self.dims.d_model if self.spec.has_channel else 0)
    extra = 2.0 * n if self.spec.variant == "lift_rnn" else 0.0
    return train_flops_per_token(matmul, pairs / t, self.dims.n_layers, self.dims.d_model) + extra
