"""`python -m nsl.evals.persistent_window --workdir=RUN [--omega=64] [--docs=N]`: the
persistent-state probe Δℓ_i(M_ω) (docs/papers/sps.md#analyses).

Δℓ_i(M_ω) = NLL of target i when persistent keys are restricted to the last ω tokens
(`Rule(persistent_window=ω)`: a persistent key k is visible to query q iff
tok(q) - tok(k) <= ω) minus the NLL with the trained rule, same parameters. Temporary keys keep
their window w. For the standard transformer every key is persistent, so the probe is a
sliding window of ω tokens; for 2x memory it cuts x and ρ keys alike.

Documents: the run's validation windows (in order) are packed, so a window holds pieces of
documents told apart by `segment`. Each (window, segment) piece is one document as far as the
model is concerned — it cannot see past the window start — and i counts targets from the
piece's first token. Δℓ_i is averaged over the first `--docs` pieces, per i; the summary also
gives the mean over all targets with i > ω (for i <= ω the probe changes nothing, Δ = 0).
Writes JSON (`--out`, default WORKDIR/persistent_window.json) and a plot next to it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from nsl.errors import NslError, cli_main
from nsl import runs
from nsl.evals import common


def spans(segment_BT: np.ndarray, weights_BT: np.ndarray):
  """(row, start, stop) of every document piece with at least one counted target, in order."""
  out = []
  for r in range(segment_BT.shape[0]):
    seg = segment_BT[r]
    edges = np.flatnonzero(np.diff(seg)) + 1
    for start, stop in zip(np.r_[0, edges], np.r_[edges, seg.size]):
      if seg[start] > 0 and weights_BT[r, start:stop].any():
        out.append((r, int(start), int(stop)))
  return out


def run(workdir: str, omega: int = 64, docs: int = 8000, batch_size: int = 8) -> dict:
  config, family, params = runs.load_run(workdir)
  base_rule = family.rule
  probe_rule = dataclasses.replace(base_rule, persistent_window=omega)
  probe_model = family.with_rule(probe_rule)

  @jax.jit
  def both(batch):
    base, w = common.token_nll(family, params, batch)
    probe, _ = common.token_nll(family, params, batch, probe_model)
    return base, probe, w

  t = config.data.seq_len
  total = np.zeros(t)
  count = np.zeros(t)
  base_sum = probe_sum = 0.0
  n_docs = 0
  for batch in common.eval_batches(config, batch_size, workdir=workdir):
    jb = {k: jnp.asarray(v) for k, v in batch.items()}
    base, probe, w = (np.asarray(a, np.float64) for a in both(jb))
    seg = np.asarray(batch["segment"])[:, :-1]
    for r, start, stop in spans(seg, w):
      if n_docs == docs:
        break
      n_docs += 1
      m = w[r, start:stop] > 0
      i = np.arange(stop - start)[m]
      delta = (probe[r, start:stop] - base[r, start:stop])[m]
      np.add.at(total, i, delta)
      np.add.at(count, i, 1)
      base_sum += base[r, start:stop][m].sum()
      probe_sum += probe[r, start:stop][m].sum()
    if n_docs == docs:
      break
  if n_docs == 0:
    raise NslError(f"the validation split of {config.data.path} has no document with a counted target")
  mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
  beyond = count[omega + 1:].sum()
  return {
      "workdir": os.path.abspath(workdir), "step": runs.checkpoint_step(workdir), "family": config.family,
      "variant": config.model.variant, "window": config.model.window, "omega": omega,
      "docs": n_docs, "docs_requested": docs, "targets": int(count.sum()),
      "base_nll": base_sum / count.sum(), "probe_nll": probe_sum / count.sum(),
      "delta_mean_beyond_omega": float(total[omega + 1:].sum() / beyond) if beyond else None,
      "targets_beyond_omega": int(beyond),
      "delta_by_position": [None if np.isnan(x) else float(x) for x in mean],
      "count_by_position": [int(c) for c in count],
  }


def plot(result: dict, path: str) -> str:
  from nsl import plots

  plt = plots.pyplot()

  d = result["delta_by_position"]
  xs = [i for i, v in enumerate(d) if v is not None]
  fig, ax = plt.subplots(figsize=(7, 4.5))
  ax.plot(xs, [d[i] for i in xs], lw=1)
  ax.axvline(result["omega"], color="gray", ls="--", lw=1, label=f"ω = {result['omega']}")
  ax.axhline(0, color="black", lw=0.5)
  ax.set_xlabel("position i in the document (tokens)")
  ax.set_ylabel("Δℓ_i(M_ω): NLL increase (nats)")
  ax.set_title(f"persistent keys limited to the last ω tokens: {result['variant'] or result['family']}, "
               f"{result['docs']} docs")
  ax.grid(alpha=0.3)
  ax.legend()
  return plots.save(fig, path, dpi=120)


@cli_main
def main(argv=None) -> int:
  p = common.run_parser("persistent_window", __doc__)
  p.add_argument("--omega", type=int, default=64, help="persistent-key window ω in tokens")
  p.add_argument("--docs", type=int, default=8000, help="documents to average over (fewer if the split ends)")
  p.add_argument("--batch_size", type=int, default=8, help="documents per forward pass")
  p.add_argument("--out", default=None, help="JSON path (default WORKDIR/persistent_window.json)")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  if args.omega < 0 or args.docs < 1 or args.batch_size < 1:
    raise NslError("--omega must be >= 0, --docs and --batch_size >= 1")
  result = run(args.workdir, args.omega, args.docs, args.batch_size)
  out = args.out or os.path.join(args.workdir, "persistent_window.json")
  common.write_result(result, out, plot)
  print(json.dumps({k: result[k] for k in ("out", "docs", "omega", "base_nll", "probe_nll",
                                           "delta_mean_beyond_omega") if k in result} | {"out": out}))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
