"""An nsl run as an lm-evaluation-harness model: `lm_eval --model nsl --model_args run=RUN_DIR`.

`NslLM` is a `lm_eval.api.model.TemplateLM` (docs/guide/evaluation.md#lm-eval-harness) for every
family. The harness's own `TemplateLM.loglikelihood` tokenizes each request (a context's trailing
spaces move to the continuation, continuation = enc(context + continuation)[len(enc(context)):],
an empty context becomes [EOS]); here the token requests are scored as the harness's HFLM scores
them:
  - rows are (context + continuation)[-(seq_len + 1):] (long contexts lose their left end), the
    model reads row[:-1], right-padded to the run's seq_len (padding is segment 0, which no real
    token attends to), `batch_size` rows per forward pass, longest first;
  - a request's result is the summed log-probability of its continuation tokens and whether each
    one is the argmax, from `Family.continuation_logits` (next-token logits [B, T, V] aligned with
    the inputs; a LIFT run is fed the states it uses at inference; the double decoder reads the
    context as context and the continuation as its block);
  - `loglikelihood_rolling` cuts a document into the harness's disjoint windows of seq_len
    predictions (`lm_eval.utils.get_rolling_token_windows`, context 1, EOS first) and sums them;
  - `generate_until` left-truncates each context to seq_len - max_gen_toks tokens, generates with
    the family's decoder (`Family.decoder()`; a family without one, SED, decodes greedily
    through `token_logits`) and cuts the text at the first stop sequence or EOS.
Rows always have the run's seq_len, so each batch shape compiles once whatever the families'
layouts need. Registered with the harness as "nsl" by `register()` (`python -m nsl.evals.lm_eval`
calls it before the harness's command line runs).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from nsl.errors import NslError

MODEL_NAME = "nsl"
DEFAULT_BATCH_SIZE = 16
# keys of a task's generation_kwargs that Family.generate has a meaning for; others are ignored, with a warning
GEN_KEYS = ("until", "max_gen_toks", "do_sample", "temperature")
log = logging.getLogger(__name__)


def _positive_int(name: str, value) -> int:
  try:
    n = int(value)
  except (TypeError, ValueError):
    n = 0
  if n < 1:
    raise NslError(f"{name}={value!r}: must be an integer >= 1 (--model_args {name}=N)")
  return n


def _batch_size(value) -> int:
  """The harness passes --batch_size as given: an int, a digit string, or "auto[:N]"; nsl has no
  memory probe, so "auto" means the default."""
  if value is None or (isinstance(value, str) and value.startswith("auto")):
    return DEFAULT_BATCH_SIZE
  return _positive_int("batch_size", value)


class NslLM(TemplateLM):
  """The harness's model interface over a run directory (`run`, as `--model_args run=RUN_DIR`) or
  a loaded run's pieces (config, family, params, tokenizer, eos_id; `scorer` a
  `nsl.evals.common.make_scorer` to reuse)."""

  def __init__(self, run: str | None = None, *, data: str | None = None, batch_size=DEFAULT_BATCH_SIZE,
               max_gen_toks=256, seed=0, config=None, family=None, params=None, tokenizer=None,
               eos_id: int | None = None, scorer=None, max_batch_size=None, device=None, **unknown):
    super().__init__()
    del max_batch_size, device  # the harness's torch options; JAX places the run itself
    if unknown:
      raise NslError(f"--model_args {', '.join(sorted(unknown))}: not an option of the nsl model; it takes "
                     "run=RUN_DIR, data=DIR, batch_size=N, max_gen_toks=N, seed=N")
    if run is not None:
      config, family, params, tokenizer, eos_id = load(run, data)
    if family is None or tokenizer is None or eos_id is None:
      raise NslError("the nsl lm-eval model needs a run: --model_args run=RUN_DIR")
    self.config, self.family, self.params = config, family, params
    self.tokenizer, self._eos = tokenizer, int(eos_id)
    self.seq_len = int(config.data.seq_len)
    self.batch_size = _batch_size(batch_size)
    self.max_gen_toks = _positive_int("max_gen_toks", max_gen_toks)
    self.seed, self.mesh = int(seed), None
    self._score, self._generate_uncached_step = scorer, None

  # -- tokens -------------------------------------------------------------------------------------
  @property
  def eot_token_id(self) -> int:
    return self._eos

  @property
  def max_length(self) -> int:
    return self.seq_len

  @property
  def tokenizer_name(self) -> str:  # the harness fingerprints its request cache with it
    return f"nsl-{self.tokenizer.name}-{self.tokenizer.vocab_size}"

  def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
    del add_special_tokens, kwargs  # nsl's tokenizers add no BOS; documents end with EOS
    return list(self.tokenizer.encode(string))

  def tok_decode(self, tokens) -> str:
    # ids past the tokenizer (the embedding's padding rows, SPS's <predict> row) are no text; a
    # model can still draw them, so they decode to nothing
    return self.tokenizer.decode([int(t) for t in tokens if 0 <= int(t) < self.tokenizer.vocab_size])

  def __call__(self, pairs) -> list[tuple[float, bool]]:
    """`loglikelihood` on plain (context, continuation) strings: the `loglik` of
    `nsl.evals.zeroshot_tasks.score_task`."""
    return self.loglikelihood([SimpleNamespace(args=tuple(p)) for p in pairs], disable_tqdm=True)

  # -- scoring ------------------------------------------------------------------------------------
  def _scorer(self):
    """`nsl.evals.common.make_scorer`'s jitted forward (log p and greedy of each next token),
    built on first use; on a mesh the batch grows to a multiple of its data-parallel devices."""
    from nsl.evals.nll import mesh_of

    if self._score is None:
      from nsl.evals.common import make_scorer

      self._score = make_scorer(self.family, self.config)
    if self.mesh is None and (mesh := mesh_of(self.params)) is not None:
      self.mesh = mesh
      dp = mesh.shape["data"] * mesh.shape["fsdp"]
      self.batch_size = -(-self.batch_size // dp) * dp
    return self._score

  def _forward(self, tok, seg, start):
    """Scores the rows; the inputs of row b from start[b] on (its last context token) continue its context."""
    from nsl import sharding

    score = self._scorer()
    if self.mesh is None:
      return score(self.params, tok, seg, start)
    with sharding.use_mesh(self.mesh):
      batch = sharding.global_batch({"tokens": tok, "segment": seg, "start": start}, self.mesh)
      return score(self.params, batch["tokens"], batch["segment"], batch["start"])

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
    del disable_tqdm, kwargs
    self._scorer()  # fixes batch_size on a mesh
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][1]) + len(requests[i][2])))
    out: list = [None] * len(requests)
    for start in range(0, len(order), self.batch_size):
      rows = order[start:start + self.batch_size]
      tok = np.full((self.batch_size, self.seq_len + 1), self._eos, np.int32)
      seg = np.zeros((self.batch_size, self.seq_len + 1), np.int32)
      spans = []
      for r, i in enumerate(rows):
        _, ctx, cont = requests[i]
        if not ctx or not cont:
          raise ValueError(f"request {i}: empty context or continuation tokens ({len(ctx)}, {len(cont)})")
        whole = (list(ctx) + list(cont))[-(self.seq_len + 1):]
        tok[r, :len(whole)], seg[r, :len(whole)] = whole, 1
        spans.append((len(whole) - 1, min(len(cont), len(whole) - 1)))
      start = np.zeros(self.batch_size, np.int32)
      start[:len(spans)] = [n_in - k for n_in, k in spans]
      lp, greedy = (np.asarray(a) for a in self._forward(tok, seg, start))
      for r, (i, (n_in, k)) in enumerate(zip(rows, spans)):
        out[i] = (float(lp[r, n_in - k:n_in].sum()), bool(greedy[r, n_in - k:n_in].all()))
        if requests[i][0] is not None:
          self.cache_hook.add_partial("loglikelihood", requests[i][0], out[i])
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    windows, owner = [], []
    for i, req in enumerate(requests):
      (text,) = req.args
      for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
          token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.seq_len,
          context_len=1)):
        windows.append((None, ctx, cont))
        owner.append(i)
    totals = [0.0] * len(requests)
    for i, (ll, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm)):
      totals[i] += ll
    for req, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
    return totals

  # -- generation ---------------------------------------------------------------------------------
  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    del disable_tqdm
    eos_text = self.tok_decode([self._eos])
    groups, out = defaultdict(list), [None] * len(requests)
    for i, req in enumerate(requests):
      context, gen_kwargs = req.args
      kw = normalize_gen_kwargs(dict(gen_kwargs or {}), self.max_gen_toks)
      ignored = sorted(set(kw) - set(GEN_KEYS))
      if ignored:
        log.warning("nsl lm-eval model: generation options %s are not supported and are ignored", ignored)
      until = handle_stop_sequences(kw.get("until"), eos=eos_text)
      new = int(kw["max_gen_toks"])
      budget = self.seq_len - new
      if budget < 1:
        raise NslError(f"max_gen_toks={new} leaves no room for a context in the run's seq_len={self.seq_len}; "
                       "lower it (--model_args max_gen_toks=N, or the task's generation_kwargs)")
      temperature = float(kw.get("temperature", 0.0)) if kw.get("do_sample") else 0.0
      ctx = self.tok_encode(context)[-budget:] or [self._eos]
      groups[(len(ctx), new, temperature)].append((i, ctx, until))
    for (n, new, temperature), items in groups.items():
      for start in range(0, len(items), self.batch_size):
        chunk = items[start:start + self.batch_size]
        # a full batch of rows (the first repeated) keeps one compiled shape per prompt length
        prompt = np.asarray([c for _, c, _ in chunk] + [chunk[0][1]] * (self.batch_size - len(chunk)), np.int32)
        tokens = self._generate(prompt, new, temperature, seed=hash((self.seed, n, new, start)) % 2**31)
        for (i, _, until), row in zip(chunk, tokens):
          text = postprocess_generated_text(self.tok_decode(row), stop=until, think_end_token=None)
          out[i] = text
          self.cache_hook.add_partial("generate_until", requests[i].args, text)
    return out

  def _generate(self, prompt_BN, new: int, temperature: float, seed: int) -> np.ndarray:
    """[B, new] tokens: the family's decoder (`Family.decoder`), or, for a family without one,
    `token_logits` over the whole row (SED)."""
    import jax

    decoder, rng = self.family.decoder(), jax.random.PRNGKey(seed)
    if decoder is not None:
      tokens, _ = decoder.generate(self.params, prompt_BN, new, temperature=temperature, rng=rng)
      return np.asarray(tokens)
    return self.generate_uncached(prompt_BN, new, temperature, rng)

  def generate_uncached(self, prompt_BN, new: int, temperature: float = 0.0, rng=None) -> np.ndarray:
    """Decoding without a cache: each token is drawn from `token_logits` at the last filled
    position of a seq_len + 1 row (later positions are segment 0, so no token sees them)."""
    import jax
    import jax.numpy as jnp

    from nsl import decode

    if self._generate_uncached_step is None:
      family = self.family

      @jax.jit
      def step(p, tok, length, key, temp):
        seg = (jnp.arange(tok.shape[1]) < length).astype(jnp.int32)[None].repeat(tok.shape[0], 0)
        logits = family.token_logits(p, {"tokens": tok, "segment": seg})
        nxt = decode.sample(jax.lax.dynamic_index_in_dim(logits, length - 1, axis=1, keepdims=False), key, temp)
        return jax.lax.dynamic_update_slice_in_dim(tok, nxt[:, None], length, axis=1), nxt

      self._generate_uncached_step = step
    b, n = prompt_BN.shape
    tok = jnp.zeros((b, self.seq_len + 1), jnp.int32).at[:, :n].set(jnp.asarray(prompt_BN, jnp.int32))
    keys = jax.random.split(jax.random.PRNGKey(0) if rng is None else rng, new)
    out = []
    for k in range(new):
      tok, nxt = self._generate_uncached_step(self.params, tok, jnp.int32(n + k), keys[k], jnp.float32(temperature))
      out.append(nxt)
    return np.asarray(jnp.stack(out, axis=1))


def load(run: str, data: str | None = None):
  """(config, family, params, tokenizer, eos_id) of a run directory; the tokenizer is the run's own
  (`nsl.data.rundata.tokenizer`: RUN/tokenizer, else its data dir) or that of `data`, a directory
  prepared with the same tokenizer."""
  import ml_collections

  from nsl.data import rundata
  from nsl.evals.nll import _load_run, check_workdir

  tokenizer, eos_id, _ = rundata.tokenizer(run, ml_collections.ConfigDict(check_workdir(run)), data)
  config, family, params = _load_run(run)
  return config, family, params, tokenizer, eos_id


def register() -> None:
  """Registers `NslLM` with the harness as "nsl" (idempotent)."""
  import lm_eval.models  # noqa: F401  the harness's own models first (it imports them only into an empty registry)
  from lm_eval.api.registry import model_registry

  if MODEL_NAME not in model_registry:
    model_registry.register(MODEL_NAME, target=NslLM)
