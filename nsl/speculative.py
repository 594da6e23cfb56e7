"""Self-speculative decoding (docs/papers/nextlat.md#speculative-decoding): a family decoder's draft
model (`Decoder.speculative`, NextLat's `nsl.models.nextlat_decode.Decoder`) measured against plain
decoding on the same trunk and cache, side by side (`measure`, `nsl.bench.decode`)."""

from __future__ import annotations

import time

import jax
import numpy as np

from nsl.models.nextlat_decode import Decoder  # noqa: F401  what `drafter` builds for a NextLat run


def drafter(family):
  """The family decoder's `speculative` factory (`nsl.models.decoder.Decoder`), or a one-line
  ConfigError when the family has no draft model."""
  from nsl.errors import ConfigError
  from nsl.models import decoder

  make = decoder.require(family, "self-speculative decoding").speculative
  if make is None:
    raise ConfigError(f"self-speculative decoding needs a draft model (NextLat's latent dynamics), and this "
                      f"family {family.name!r} run has none")
  return make


def measure(family, params, prompts, new_tokens: int, draft_len: int | None = None,
            temperature: float = 0.0, seed: int = 0) -> dict[str, dict[str, float]]:
  """Plain vs self-speculative decoding over `prompts` (a list of 1-D token arrays of one
  length; another length recompiles inside the timing), plain and speculative alternating prompt
  by prompt, after a first call of each (compiles included: `first_call_s`). Returns
  {'plain': {...}, 'speculative': {...}, 'setup': {...}}: tokens/s for each; for speculative also the mean tokens per draft round
  (accepted drafts + 1, the paper's "accepted tokens per draft"), the mean accepted drafts, and
  the speed-up; `greedy_match` when temperature is 0 (outputs identical to plain decoding); for
  plain the mean fraction of distinct tokens per output (low: repetitive text, drafted easily)."""
  dec = drafter(family)(params, draft_len, temperature)
  rng = jax.random.PRNGKey(seed)
  first = []  # first calls, compiles included (cache shapes depend on the lengths)
  for gen in (dec.generate, dec.generate_speculative):
    t0 = time.perf_counter()
    gen(prompts[0], new_tokens, rng)
    first.append(time.perf_counter() - t0)
  # Alternate plain and speculative per prompt so load drift on a shared machine hits both alike.
  plain_out, spec, t_plain, t_spec = [], [], 0.0, 0.0
  for i, p in enumerate(prompts):
    t0 = time.perf_counter()
    plain_out.append(dec.generate(p, new_tokens, jax.random.fold_in(rng, i)))
    t1 = time.perf_counter()
    spec.append(dec.generate_speculative(p, new_tokens, jax.random.fold_in(rng, i)))
    t_plain, t_spec = t_plain + t1 - t0, t_spec + time.perf_counter() - t1
  acc = np.concatenate([np.asarray(s["accepted"], np.float64) for _, s in spec])
  total = new_tokens * len(prompts)
  # Degenerate loops (an undertrained model's greedy text) are easy to draft: say how varied the output was.
  distinct = float(np.mean([len(set(np.asarray(o).tolist())) / len(o) for o in plain_out]))
  plain = {"tokens_per_s": total / t_plain, "seconds": t_plain, "first_call_s": first[0], "trunk_calls_per_token": 1.0,
           "distinct_token_fraction": distinct}
  specd = {"tokens_per_s": total / t_spec, "seconds": t_spec, "first_call_s": first[1],
           "mean_tokens_per_draft": float(np.mean(acc + 1)), "mean_accepted_drafts": float(np.mean(acc)),
           "acceptance_rate": float(np.mean(acc) / dec.k), "rounds": int(acc.size),
           "speedup": t_plain / t_spec}
  if temperature == 0:
    specd["greedy_match"] = bool(all(np.array_equal(a, s[0]) for a, s in zip(plain_out, spec)))
  setup = {"draft_len": dec.k, "temperature": temperature, "new_tokens": new_tokens, "prompts": len(prompts),
           "prompt_len": int(np.mean([len(p) for p in prompts])), "backend": jax.default_backend()}
  return {"plain": plain, "speculative": specd, "setup": setup}
