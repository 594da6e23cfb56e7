"""nsl's NextLat held against the authors' code (issue #45; docs/xcheck/nextlat.md).

nsl's side of the cross-check; `peer_nextlat.py` beside it is theirs (a torch venv and a
directory with their `models/model_nextlat.py`, read at run time, never copied here). The two
sides meet in files: nsl dumps its training batches, the peer writes its initial weights, its
first-batch logits and loss terms and its per-step curves, nsl reads them.

  PY=.venv/bin/python; PEER_PY=/path/to/torch-venv/bin/python; PEER=/path/to/their/code; B=runs/xcheck_nextlat
  $PY tools/xcheck/nextlat.py batches --out=$B                  # 300 path-star batches + meta.json
  $PEER_PY tools/xcheck/peer_nextlat.py --peer_dir=$PEER --batches=$B --mode=init --seed=0 --out=$B/peer_s0
  $PY tools/xcheck/nextlat.py port --batches=$B --peer=$B/peer_s0         # (1) logits and loss terms
  $PEER_PY tools/xcheck/peer_nextlat.py --peer_dir=$PEER --batches=$B --mode=train --seed=0 --out=$B/peer_s0
  $PY tools/xcheck/nextlat.py train --batches=$B --init=$B/peer_s0 --out=$B/nsl_ported_s0   # (2)
  $PY tools/xcheck/nextlat.py train --batches=$B --init_seed=S --out=$B/nsl_own_sS         # (3), S = 0, 1, 2
  (peer --mode=train --seed=S for S = 1, 2 as well)
  $PY tools/xcheck/nextlat.py report --batches=$B [--plot=docs/img/xcheck/nextlat_curves.png]

The tiny setting (`tiny_config`): path-star G_{2,5} (one 33-token problem per row), the
authors' trunk and p_ψ at 2 layers, 4 heads, d 64 (SwiGLU 128, p_ψ width 128: their
proj_factor 1.0), rollout d = 3, λ_h = λ_KL = 1, batch 32, AdamW (0.9, 0.95) at a constant
1e-3, weight decay 0.1, clipping at 100 (their path-star value), fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root: configs/, tests/

TERMS = ("loss", "ce", "next_h", "kl")
# The model sizes: `tiny` for the checks, `fixture` (smaller) for the saved port check that
# tests/xcheck/test_nextlat_port.py replays without torch. p_ψ's width is theirs,
# 128·round(proj_factor · 2d / 128): 128 for both.
SIZES = {"tiny": {"d_model": 64, "n_layers": 2, "n_heads": 4, "proj_factor": 1.0, "batch": 32},
         "fixture": {"d_model": 32, "n_layers": 1, "n_heads": 2, "proj_factor": 2.0, "batch": 4}}
HORIZON, STEPS, LR = 3, 300, 1e-3


def tiny_config(init_seed: int | None = None, size: str = "tiny"):
  """configs/nextlat.py:nextlat_path_star, shrunk to a size of `SIZES` on G_{2,5}."""
  from configs import nextlat as nextlat_configs
  from nsl.models.latent_spec import authors_hidden

  z = SIZES[size]
  c = nextlat_configs.nextlat_path_star()
  nextlat_configs.path_star_data(c, d=2, l=5, n_train=20_000, n_test=1_000)
  nextlat_configs.path_star_model(c, layers=z["n_layers"], heads=z["n_heads"], width=z["d_model"])
  c.nextlat.horizon = HORIZON
  c.nextlat.hidden = authors_hidden(z["d_model"], z["proj_factor"])
  c.train.batch_size, c.train.steps, c.train.lr = z["batch"], STEPS, LR
  c.model.dtype = "float32"
  c.init_seed = init_seed
  return c


def cmd_batches(a) -> None:
  """The first `steps` training batches in the trainer's order (seed 0), checked to be one
  problem per row, and meta.json: what the peer needs to build and train the same model."""
  from nsl.data import pipeline
  from nsl.data.tasks import path_star
  from nsl.train import loop

  c = tiny_config(size=a.size)
  z = SIZES[a.size]
  loop.prepare_data(c)
  it = pipeline.make_train_iterator(c.data.path, seq_len=c.data.seq_len, global_batch_size=z["batch"], seed=c.seed)
  rows = [next(it) for _ in range(a.steps)]
  tokens = np.stack([r["tokens"] for r in rows]).astype(np.int32)
  segment = np.stack([r["segment"] for r in rows]).astype(np.int32)
  task = path_star.PathStar(d=2, l=5)
  if not ((tokens[:, :, -1] == path_star.EOS).all() and (tokens[:, :, task.prompt_len - 1] == path_star.ANSWER).all()
          and (segment == segment[:, :, :1]).all()):
    raise SystemExit("the dumped rows are not one path-star problem each: the peer's masks would differ")
  os.makedirs(a.out, exist_ok=True)
  np.save(os.path.join(a.out, "train_tokens.npy"), tokens)
  np.save(os.path.join(a.out, "train_segment.npy"), segment)
  n = c.nextlat
  meta = {"seq_len": int(c.data.seq_len), "eos_id": path_star.EOS,
          # their prompt mask: targets at document positions 1..context_length+1 are dropped, so
          # context_length = prompt_len - 1 drops every target up to '=' (nsl: data.answer_token)
          "context_length": task.prompt_len - 1,
          "size": a.size,
          "model": {"vocab_size": int(c.model.vocab_size), "n_layers": z["n_layers"], "n_heads": z["n_heads"],
                    "d_model": z["d_model"], "horizon": int(n.horizon), "lambda_h": float(n.lambda_h),
                    "lambda_kl": float(n.lambda_kl), "proj_factor": z["proj_factor"]},
          "train": {"lr": LR, "b1": c.train.b1, "b2": c.train.b2, "weight_decay": c.train.weight_decay,
                    "clip_norm": c.train.clip_norm}}
  with open(os.path.join(a.out, "meta.json"), "w") as f:
    json.dump(meta, f, indent=1)
  print(f"wrote {a.steps} batches {tokens.shape[1:]} and meta.json to {a.out}")


def from_peer(sd: dict, n_layers: int, n_heads: int) -> dict:
  """nsl's parameter tree from their state_dict (numpy): torch Linear weights are [out, in],
  nsl's matrices [in, out]; their fused q/k/v and gate/up projections are split; heads are the
  contiguous head_dim slices of q, k, v (their .view(B, T, n_head, d_head))."""
  d = sd["token_embedding.weight"].shape[1]
  hd = d // n_heads
  trunk = {"final_norm": {"scale": sd["transformer.norm.weight"]}}
  for i in range(n_layers):
    p = f"transformer.blocks.{i}."
    qkv = sd[p + "attn.c_attn.weight"]
    gate_up = sd[p + "mlp.up.gate_up.weight"]
    f = gate_up.shape[0] // 2
    trunk[f"block_{i}"] = {
        "attn_norm": {"scale": sd[p + "ln_1.weight"]},
        "attn": {name: qkv[j * d:(j + 1) * d].T.reshape(d, n_heads, hd) for j, name in enumerate(("wq", "wk", "wv"))}
        | {"wo": sd[p + "attn.c_proj.weight"].T.reshape(n_heads, hd, d)},
        "mlp_norm": {"scale": sd[p + "ln_2.weight"]},
        "mlp": {"w_gate": gate_up[:f].T, "w_up": gate_up[f:].T, "w_down": sd[p + "mlp.down.weight"].T},
    }
  dyn = {"norm": {"scale": sd["dynamics_model.norm_x.weight"]}}
  dyn |= {f"w{j}": sd[f"dynamics_model.mlp.{2 * j}.weight"].T for j in range(3)}
  return {"embed": {"embedding": sd["token_embedding.weight"], "head": sd["lm_head.weight"]},
          "trunk": trunk, "dynamics": dyn}


def _family(init_seed: int | None = None, size: str = "tiny"):
  from nsl.models import registry

  return registry.get_family(tiny_config(init_seed, size))


def _size(batches: str) -> str:
  with open(os.path.join(batches, "meta.json")) as f:
    return json.load(f).get("size", "tiny")


def ported_params(family, sd: dict):
  """`from_peer(sd)` checked against nsl's own tree (same paths and shapes), as float32 arrays."""
  import flax.linen as nn
  import jax

  params = from_peer(sd, family.dims.n_layers, family.dims.n_heads)
  mine = nn.unbox(family.abstract_params())
  want = jax.tree_util.tree_structure(mine)
  if jax.tree_util.tree_structure(params) != want:
    raise SystemExit(f"ported tree differs from nsl's:\n{jax.tree_util.tree_structure(params)}\n{want}")
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(mine)):
    if a.shape != b.shape:
      raise SystemExit(f"{jax.tree_util.keystr(path)}: theirs {a.shape}, nsl {b.shape}")
  return jax.tree.map(lambda x: jax.numpy.asarray(x, jax.numpy.float32), params)


def load_ported(family, prefix: str):
  """Their initial weights (peer_nextlat.py --mode=init) as nsl parameters."""
  with np.load(prefix + ".weights.npz") as z:
    return ported_params(family, {k: z[k] for k in z.files})


def port_check(family, params, tokens, segment, their_logits, their_terms: dict, tol: float) -> dict:
  """nsl's logits and loss terms from `params` on one batch beside theirs: max |Δ| of each."""
  batch = _batch(tokens, segment)
  logits = np.asarray(family.token_logits(params, batch))
  theirs = their_logits[:, :logits.shape[1]]  # their last position is EOS's, which predicts nothing
  loss, m = family.loss(params, batch, None, 0)
  mine = {"loss": float(loss), "ce": float(m["ce"]), "next_h": float(m["next_h"]), "kl": float(m["kl"])}
  out = {"max_abs_dlogit": float(np.max(np.abs(logits - theirs))), "logit_scale": float(np.max(np.abs(theirs))),
         "nsl": mine, "peer": their_terms, "abs_diff": {k: abs(mine[k] - their_terms[k]) for k in TERMS}}
  out["pass"] = out["max_abs_dlogit"] <= tol and all(v <= tol for v in out["abs_diff"].values())
  return out


def _batch(tokens, segment):
  import jax.numpy as jnp

  return {"tokens": jnp.asarray(tokens), "segment": jnp.asarray(segment)}


def cmd_port(a) -> dict:
  """(1): their initial weights in nsl give their logits and loss terms on the first batch."""
  family = _family(size=_size(a.batches))
  params = load_ported(family, a.peer)
  tokens = np.load(os.path.join(a.batches, "train_tokens.npy"))[0]
  segment = np.load(os.path.join(a.batches, "train_segment.npy"))[0]
  with np.load(a.peer + ".ref.npz") as z:
    their_logits = z["logits"]
  with open(a.peer + ".ref.json") as f:
    ref = json.load(f)
  out = port_check(family, params, tokens, segment, their_logits, ref, a.tol)
  with open(a.peer + ".port.json", "w") as f:
    json.dump(out, f, indent=1)
  print(json.dumps(out))
  if a.fixture:  # data for the torch-free test: their weights, the batch, their logits and terms
    with np.load(a.peer + ".weights.npz") as z:
      weights = {f"w/{k}": z[k] for k in z.files}
    np.savez(a.fixture, tokens=tokens, segment=segment, logits=their_logits[:, :tokens.shape[1] - 1],
             terms=np.array([ref[k] for k in TERMS], np.float64), **weights)
    print(f"wrote {a.fixture} ({os.path.getsize(a.fixture) / 1024:.0f} KiB)")
  return out


def cmd_train(a) -> None:
  """nsl's trainer step (nsl.train.step, nsl's AdamW and schedule) on the dumped batches, from
  their ported weights (--init=PREFIX) or nsl's own initialisation (--init_seed)."""
  import flax.linen as nn
  import jax

  from nsl.train import state as train_state
  from nsl.train import step as step_lib

  family = _family(None if a.init else a.init_seed, _size(a.batches))
  c = family.config
  if a.init:
    params = load_ported(family, a.init)
  else:
    params = nn.unbox(family.init(jax.random.PRNGKey(a.init_seed)))
  optimizer = train_state.make_optimizer(c)
  state = train_state.create(params, optimizer)
  step_fn = jax.jit(step_lib.make_train_step(family, c, 1))
  schedule = train_state.schedule_args(c)
  tokens = np.load(os.path.join(a.batches, "train_tokens.npy"))
  segment = np.load(os.path.join(a.batches, "train_segment.npy"))
  rng = jax.random.PRNGKey(0)
  with open(a.out + ".jsonl", "w") as f:
    for s in range(min(a.steps, len(tokens))):
      state, m = step_fn(state, _batch(tokens[s], segment[s]), rng, schedule)
      f.write(json.dumps({"step": s + 1, **{k: float(m[k]) for k in TERMS}}) + "\n")
  print(f"{a.out}.jsonl: step {s + 1} loss {float(m['loss']):.4f}")


def read_curve(path: str) -> dict[str, np.ndarray]:
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return {k: np.array([r[k] for r in rows]) for k in TERMS}


def gaps(a_curve: dict, b_curve: dict, lo: int = 1, hi: int | None = None) -> dict:
  """Mean and worst |a - b| of each term over steps lo..hi (1-based, inclusive)."""
  out = {}
  for k in TERMS:
    x, y = a_curve[k][lo - 1:hi], b_curve[k][lo - 1:hi]
    n = min(len(x), len(y))
    d = np.abs(x[:n] - y[:n])
    out[k] = {"mean": float(d.mean()), "worst": float(d.max()), "worst_step": int(lo + d.argmax()), "steps": n}
  return out


def seed_comparison(peer: list[dict], mine: list[dict], lo: int = 50, hi: int = 300) -> dict:
  """(3): per-seed means over steps lo..hi, the mean curves' mean gap and two standard errors
  of the difference of the side means (seed spread: per-side std of the per-seed means)."""
  out = {}
  for k in TERMS:
    p = np.array([c[k][lo - 1:hi].mean() for c in peer])
    m = np.array([c[k][lo - 1:hi].mean() for c in mine])
    mean_gap = float(np.mean(np.mean([c[k][lo - 1:hi] for c in mine], 0) - np.mean([c[k][lo - 1:hi] for c in peer], 0)))
    se = float(np.sqrt(p.var(ddof=1) / len(p) + m.var(ddof=1) / len(m))) if len(p) > 1 and len(m) > 1 else float("nan")
    out[k] = {"peer_seed_means": p.round(4).tolist(), "nsl_seed_means": m.round(4).tolist(),
              "peer_std": float(p.std(ddof=1)) if len(p) > 1 else None,
              "nsl_std": float(m.std(ddof=1)) if len(m) > 1 else None,
              "mean_gap_nsl_minus_peer": mean_gap, "two_se": 2 * se,
              "pass": abs(mean_gap) <= max(0.04, 2 * se)}
  return out


def cmd_report(a) -> None:
  b = a.batches
  rep = {}
  if os.path.exists(os.path.join(b, "peer_s0.port.json")):
    with open(os.path.join(b, "peer_s0.port.json")) as f:
      rep["port"] = json.load(f)
  if os.path.exists(os.path.join(b, "nsl_ported_s0.jsonl")):
    rep["ported_curve"] = gaps(read_curve(os.path.join(b, "nsl_ported_s0.jsonl")), read_curve(os.path.join(b, "peer_s0.jsonl")))
    rep["ported_curve_pass"] = all(v["mean"] <= 0.04 and v["worst"] <= 0.1 for v in rep["ported_curve"].values())
  seeds = [s for s in range(a.seeds) if os.path.exists(os.path.join(b, f"nsl_own_s{s}.jsonl"))
           and os.path.exists(os.path.join(b, f"peer_s{s}.jsonl"))]
  if seeds:
    peer = [read_curve(os.path.join(b, f"peer_s{s}.jsonl")) for s in seeds]
    mine = [read_curve(os.path.join(b, f"nsl_own_s{s}.jsonl")) for s in seeds]
    rep["own_init"] = {"seeds": seeds, **seed_comparison(peer, mine)}
  with open(os.path.join(b, "report.json"), "w") as f:
    json.dump(rep, f, indent=1)
  print(json.dumps(rep, indent=1))
  if a.plot and seeds:
    plot(b, seeds, a.plot)


def plot(b: str, seeds: list[int], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
  ported = read_curve(os.path.join(b, "nsl_ported_s0.jsonl")) if os.path.exists(os.path.join(b, "nsl_ported_s0.jsonl")) else None
  for ax, k in zip(axes, TERMS):
    for s in seeds:
      ax.plot(read_curve(os.path.join(b, f"peer_s{s}.jsonl"))[k], color="tab:orange", lw=0.8, alpha=0.7,
              label="authors (own init)" if s == seeds[0] else None)
      ax.plot(read_curve(os.path.join(b, f"nsl_own_s{s}.jsonl"))[k], color="tab:blue", lw=0.8, alpha=0.7,
              label="nsl (own init)" if s == seeds[0] else None)
    if ported is not None:
      ax.plot(ported[k], color="black", lw=0.8, ls="--", label="nsl from their seed-0 weights")
    ax.set_title(k)
    ax.set_xlabel("step")
    if k != "ce":
      ax.set_yscale("log")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=80)
  print(f"wrote {path}")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="tools/xcheck/nextlat.py")
  sub = p.add_subparsers(dest="cmd", required=True)
  s = sub.add_parser("batches")
  s.add_argument("--out", required=True)
  s.add_argument("--size", choices=tuple(SIZES), default="tiny")
  s.add_argument("--steps", type=int, default=STEPS)
  s = sub.add_parser("port")
  s.add_argument("--batches", required=True)
  s.add_argument("--peer", required=True, help="the prefix peer_nextlat.py --mode=init wrote")
  s.add_argument("--tol", type=float, default=1e-4)
  s.add_argument("--fixture", default="", help="also write the torch-free test's .npz here (--size=fixture batches)")
  s = sub.add_parser("train")
  s.add_argument("--batches", required=True)
  s.add_argument("--init", default="", help="a peer prefix: start from their weights")
  s.add_argument("--init_seed", type=int, default=0, help="nsl's own initialisation (without --init)")
  s.add_argument("--steps", type=int, default=STEPS)
  s.add_argument("--out", required=True)
  s = sub.add_parser("report")
  s.add_argument("--batches", required=True)
  s.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 that both sides have run")
  s.add_argument("--plot", default="")
  a = p.parse_args(argv)
  {"batches": cmd_batches, "port": cmd_port, "train": cmd_train, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
  main()
