"""`python -m nsl.evals.gradflow --workdir=RUN`: gradient routing r(p, k) per stream (docs/papers/sps.md#analyses).

    r(p, k) = ‖∇θ_p ℓ_{p+k}‖₂ / ‖∇θ_p ℓ_p‖₂

θ_p is "a separate parameter copy per position (per stream for SPS and delayed state)": the
trunk's matrices (every layer's W_q, W_k, W_v, W_o, W_gate, W_up, W_down) as used by the slot of
stream s (x or ρ; the token for standard) at token p; ℓ_j is the next-token NLL read out at
token j. How much does the loss k tokens later train the weights that process token p, relative
to the loss at p itself?

Reading used here, exact rather than approximated: untie every trunk matrix W per slot, W_s = W
at the trained value. A slot's matmul is y_s = x_s W_s, so ∂ℓ/∂W_s = x_sᵀ ∂ℓ/∂y_s, an outer
product whose Frobenius norm is ‖x_s‖·‖∂ℓ/∂y_s‖. We get ∂ℓ/∂y_s by adding a zero perturbation δ
to every matmul output of every slot (y = xW + δ, δ = 0) and differentiating w.r.t. δ, so

    ‖∇θ_p ℓ_j‖² = Σ_layers Σ_matrices ‖x_{slot(p), in}‖² ‖∂ℓ_j/∂y_{slot(p), out}‖²

with one backward pass per read-out position j (batched). Embeddings, norm gains and the tied
head are not part of θ_p (the head at p sees only ℓ_p; the embedding row is shared by token id).

Aggregation: over validation rows and positions p with ℓ_p and ℓ_{p+k} both counted (same
document, not padding) and ‖∇θ_p ℓ_p‖ > 0: the mean, median and geometric mean of r(p, k) for
k = 0..max_offset, and the mean of the raw norms ‖∇θ_p ℓ_{p+k}‖ (no normalisation; useful where
‖∇θ_p ℓ_p‖ = 0, e.g. the ρ stream of reverse SPS, which comes after its own read-out).
Writes JSON (`--out`, default WORKDIR/gradflow.json) and a plot next to it (.png).
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from nsl.nn import attention, cross_entropy
from nsl.errors import NslError, cli_main
from nsl import runs
from nsl.evals import common

MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


def stream_names(plan) -> tuple[str, ...]:
  return ("x", "rho") if plan.group == 2 else ("token",)


def perturbed_nll(family, params, batch, deltas, impl: str | None = None):
  """Per-target NLL [B, T] (zero where not counted) with `deltas[layer][matrix]` added to each
  trunk matmul output, and the squared input norms of those matmuls per slot (the taps).

  Slots are in the family's physical layout; the function reproduces `family.model.apply`.
  """
  from nsl import decode
  from nsl.nn import layers

  dims, plan = family.dims, family.slot_plan()
  inputs, targets, seg_in, weights = cross_entropy.next_token_targets(batch)
  b, t = inputs.shape
  g = plan.group
  lay = plan.prompt_layout(t)
  x = decode._embed(dims, params, plan, inputs).reshape(b, t * g, dims.d_model)[:, lay.pos]
  seg = jnp.repeat(seg_in, g, axis=1)[:, lay.pos]
  slots = attention.Slots(lay, segment=seg)
  sq = lambda a: jnp.sum(jnp.square(a.astype(jnp.float32)).reshape(a.shape[0], a.shape[1], -1), axis=-1)
  taps = []
  for i in range(dims.n_layers):
    p, d = layers.layer_params(params["trunk"], i), deltas[i]
    a = p["attn"]
    h = decode._norm(dims, p["attn_norm"], x)
    proj = lambda w: jnp.einsum("bsd,dhk->bshk", h, w.astype(h.dtype))
    q = layers.rope(proj(a["wq"]) + d["q"], lay.tok, dims.rope_theta)
    k = layers.rope(proj(a["wk"]) + d["k"], lay.tok, dims.rope_theta)
    v = proj(a["wv"]) + d["v"]
    o = attention.attend(q, k, v, plan.rule, slots, slots, impl=impl or dims.attention_impl,
                         chunk_q=dims.attention_chunk, chunk_k=dims.attention_chunk)
    x = x + jnp.einsum("bshk,hkd->bsd", o, a["wo"].astype(o.dtype)) + d["o"]
    h2 = decode._norm(dims, p["mlp_norm"], x)
    m = p["mlp"]
    gate = h2 @ m["w_gate"].astype(h2.dtype) + d["gate"]
    up = h2 @ m["w_up"].astype(h2.dtype) + d["up"]
    hidden = jax.nn.silu(gate) * up
    x = x + hidden @ m["w_down"].astype(hidden.dtype) + d["down"]
    taps.append({"q": sq(h), "k": sq(h), "v": sq(h), "o": sq(o), "gate": sq(h2), "up": sq(h2), "down": sq(hidden)})
  read = np.argsort(lay.pos)[plan.readout::g]  # physical index of each token's read-out slot
  logits = decode._logits(dims, params, x[:, read])
  nll = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets) * weights
  return nll, taps


def zero_deltas(family, batch_rows: int, num_tokens: int):
  dims, plan = family.dims, family.slot_plan()
  s = num_tokens * plan.group
  z = lambda *shape: jnp.zeros((batch_rows, s) + shape, jnp.float32)
  heads = (dims.n_heads, dims.head_dim)
  return [{"q": z(*heads), "k": z(*heads), "v": z(*heads), "o": z(dims.d_model), "gate": z(dims.d_ff),
           "up": z(dims.d_ff), "down": z(dims.d_model)} for _ in range(dims.n_layers)]


def slot_grad_norms(family, params, batch, chunk: int = 8, impl: str | None = None):
  """Squared norms ‖∇θ_s ℓ_j‖² for every read-out position j and slot s: [T, B, T, G] with the
  slot axis in logical (token, stream) order, plus the loss weights [B, T]."""
  from nsl.nn import cross_entropy

  plan = family.slot_plan()
  params = jax.tree.map(lambda a: a.astype(jnp.float32), params)
  _, _, _, weights = cross_entropy.next_token_targets(batch)
  b, t = weights.shape
  deltas = zero_deltas(family, b, t)
  (nll, taps), vjp_fn = jax.vjp(lambda d: perturbed_nll(family, params, batch, d, impl), deltas)

  def norms_for(j):
    ct = jnp.zeros((b, t), jnp.float32).at[:, j].set(1.0)
    (grads,) = vjp_fn((ct, jax.tree.map(jnp.zeros_like, taps)))
    total = 0.0
    for gl, tl in zip(grads, taps):
      for name in MATRICES:
        gsq = jnp.sum(jnp.square(gl[name]).reshape(b, gl[name].shape[1], -1), axis=-1)
        total = total + tl[name] * gsq
    return total  # [B, S] physical

  js = jnp.arange(t)
  out = jax.lax.map(norms_for, js, batch_size=min(chunk, t))  # [T, B, S]
  logical = np.argsort(plan.prompt_layout(t).pos)
  return out[:, :, logical].reshape(t, b, t, plan.group), weights


def routing(norms_sq, weights, segment, max_offset: int) -> dict:
  """Aggregates r(p, k) per stream from slot_grad_norms output (numpy)."""
  norms = np.sqrt(np.maximum(np.asarray(norms_sq, np.float64), 0.0))  # [J, B, P, G]
  w = np.asarray(weights) > 0
  seg = np.asarray(segment)
  t = w.shape[1]
  out = []
  for s in range(norms.shape[-1]):
    per_k = {"k": [], "count": [], "ratio_mean": [], "ratio_median": [], "ratio_geomean": [], "norm_mean": []}
    for k in range(max_offset + 1):
      p = np.arange(t - k)
      if p.size == 0:
        break
      j = p + k
      valid = w[:, p] & w[:, j] & (seg[:, p] == seg[:, j])  # [B, P]
      num = norms[j, :, p, s].T  # [B, P]: ‖∇θ_p ℓ_{p+k}‖
      den = norms[p, :, p, s].T  # ‖∇θ_p ℓ_p‖
      ok = valid & (den > 1e-12)
      ratio = num[ok] / den[ok]
      per_k["k"].append(k)
      per_k["count"].append(int(ok.sum()))
      per_k["ratio_mean"].append(float(ratio.mean()) if ratio.size else None)
      per_k["ratio_median"].append(float(np.median(ratio)) if ratio.size else None)
      per_k["ratio_geomean"].append(float(np.exp(np.mean(np.log(np.maximum(ratio, 1e-30))))) if ratio.size else None)
      per_k["norm_mean"].append(float(num[valid].mean()) if valid.any() else None)
    out.append(per_k)
  return out


def run(workdir: str, rows: int = 4, max_offset: int = 32, impl: str | None = None) -> dict:
  config, family, params = runs.load_run(workdir)
  plan = family.slot_plan()
  batch = next(iter(common.eval_batches(config, batch_size=rows, max_batches=1, workdir=workdir)))
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  norms_sq, weights = jax.jit(lambda p, bt: slot_grad_norms(family, p, bt, impl=impl))(params, batch)
  per_stream = routing(norms_sq, weights, batch["segment"][:, :-1], max_offset)
  return {
      "workdir": os.path.abspath(workdir), "step": runs.checkpoint_step(workdir),
      "family": config.family, "variant": config.model.variant, "window": config.model.window,
      "rows": rows, "tokens_per_row": int(config.data.seq_len), "max_offset": max_offset,
      "definition": "r(p,k) = ||grad_{theta_p} l_{p+k}|| / ||grad_{theta_p} l_p||, theta_p = trunk matrices "
                    "of the slot of each stream at token p (per-slot copies via zero output perturbations)",
      "streams": dict(zip(stream_names(plan), per_stream)),
  }


def plot(result: dict, path: str) -> str:
  from nsl import plots

  plt = plots.pyplot()

  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, (name, s) in enumerate(result["streams"].items()):
    for key, style in (("ratio_geomean", "o-"), ("ratio_median", "--")):
      pts = [(k, r) for k, r in zip(s["k"], s[key]) if r is not None and k > 0 and r > 0]
      if pts:
        ax.plot(*zip(*pts), style, ms=3, color=f"C{i}", label=f"{name} stream, {key.split('_')[1]}")
  ax.set_yscale("log")
  ax.set_xlabel("offset k (tokens)")
  ax.set_ylabel("r(p, k) = |∇θ_p ℓ_{p+k}| / |∇θ_p ℓ_p| over p")
  ax.set_title(f"gradient routing: {result['variant'] or result['family']} (w={result['window']}), "
               f"step {result['step']}")
  ax.grid(alpha=0.3, which="both")
  ax.legend()
  return plots.save(fig, path, dpi=120)


@cli_main
def main(argv=None) -> int:
  p = common.run_parser("gradflow", __doc__)
  p.add_argument("--out", default=None, help="JSON path (default WORKDIR/gradflow.json); the plot goes beside it")
  p.add_argument("--rows", type=int, default=4, help="validation windows to average over")
  p.add_argument("--max_offset", type=int, default=32, help="largest k")
  p.add_argument("--attention_impl", default=None, help="override the run's model.attention_impl (e.g. xla)")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  if args.rows < 1 or args.max_offset < 0:
    raise NslError("--rows must be >= 1 and --max_offset >= 0")
  result = run(args.workdir, args.rows, args.max_offset, args.attention_impl)
  out = args.out or os.path.join(args.workdir, "gradflow.json")
  common.write_result(result, out, plot)
  summary = {name: {k: s["ratio_geomean"][k] for k in (1, 4, 16) if k < len(s["ratio_geomean"])}
             for name, s in result["streams"].items()}
  print(json.dumps({"out": out, "plot": result["plot"], "ratio_geomean_at_k": summary}))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
