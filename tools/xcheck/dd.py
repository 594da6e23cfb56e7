"""Cross-check of nsl's double decoder, decoder-only and SED against their authors' code
(github.com/ashlab11/block-based-double-decoder; docs/xcheck/dd.md, tools/xcheck/README.md).

Run from the repository root with nsl's venv; the authors' side runs in a torch venv through
tools/xcheck/peer_dd.py (nothing of theirs is copied; their repository is read at run time).

  python tools/xcheck/dd.py all --repo=PEER_REPO --peer_python=PEER_VENV/bin/python \\
      [--stubs=DIR] --out=runs/xcheck_dd [--models=dd,dec,sed] [--seeds=0-2] [--steps=300]

does, resumably (a finished file is skipped), for each model on the tiny configs
(configs/dd.py:*_tiny: d 128, 2 + 1 layers, μP at base width 64, m = 2):
  1. dump: nsl's first 300 training batches (SOTU BPE-4096, 128 tokens, 16 rows), a block draw
     per step (nsl's `sample_blocks`), a check batch (batch 0 with two EOS written in, so
     document masking and label masking are exercised); SED: their span corruption of every row;
  2. port: their freshly initialised weights (seed 0) mapped into nsl (dd_port.py): max |Δlogit|
     and |ΔCE| on the check batch (pass: both <= 1e-4);
  3. ported training: both sides 300 steps from those weights on the identical batches, their
     optimizer (AdamW groups, LR·64/d on hidden matrices, wd 0.5, clip 1, 5% warmup then linear
     decay to 10%) and nsl's (`nsl.train.state.make_optimizer`) (pass: mean |Δloss| <= 0.04, worst
     <= 0.1);
  4. own init: each side from its own initialisation, seeds --seeds (nsl: init seed; theirs:
     torch.manual_seed), the same batches (pass: mean curves over steps 50-300 within 0.04, or
     within 2 standard errors of the difference);
and writes OUT/summary.json and the plot OUT/dd_xcheck.png. Subcommands `dump`, `port`,
`train`, `summary` run the pieces.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
import dd_port  # noqa: E402

SEQ, STEPS = 128, 300
WINDOW = (50, 300)
PORT_TOL, MEAN_TOL, WORST_TOL = 1e-4, 0.04, 0.1


def _schedule(steps: int) -> dict:
  """Their build_scheduler: warmup max(1, int(5%)), then linear decay to 10% over the rest."""
  warmup = max(1, int(steps * 0.05))
  return {"train.steps": steps, "train.warmup_steps": warmup, "train.decay_steps": steps - warmup,
          "train.schedule": "wsd", "train.min_lr_ratio": 0.1}


def cmd_dump(out: str, data: str, steps: int) -> None:
  import jax
  from nsl.models import double_decoder as dd

  common.dump_batches(dd_port.load_config("dd", **{"data.path": data}), out, steps)  # 128 tokens, 16 rows, seed 0
  toks = common.load_batches(out)["tokens"]
  path = os.path.join(out, "train_blocks.npy")
  if not os.path.exists(path):
    draw = jax.jit(lambda k: dd.sample_blocks(k, SEQ)[0])
    np.save(path, np.stack([np.asarray(draw(jax.random.fold_in(jax.random.PRNGKey(0xDD), s))) for s in range(len(toks))]))
  check = toks[0].copy()
  check[0, 60], check[3, 100] = 0, 0  # EOS mid-row: a document boundary inside the attention window
  np.save(os.path.join(out, "check_tokens.npy"), check)
  np.save(os.path.join(out, "check_blocks.npy"), np.load(path)[0])


def _params(model: str, family, config, weights: str | None, init_seed: int):
  import flax.linen as nn
  import jax

  if weights:
    return jax.tree.map(jax.numpy.asarray, dd_port.to_nsl(model, np.load(weights), config))
  return nn.unbox(family.init(jax.random.PRNGKey(init_seed)))


def cmd_port(model: str, weights: str, batches: str) -> dict:
  from nsl.models import registry

  config = dd_port.load_config(model)
  family = registry.get_family(config)
  ref = dict(np.load(weights))
  params = _params(model, family, config, weights, 0)
  res = dd_port.nsl_check(model, family, params, ref, np.load(os.path.join(batches, "check_tokens.npy")),
                          np.load(os.path.join(batches, "check_blocks.npy")))
  res["pass"] = res["max_abs_dlogit"] <= PORT_TOL and res["abs_dce"] <= PORT_TOL and res["weights_equal_their_labels"]
  return res


def cmd_train(model: str, batches: str, out: str, weights: str | None, init_seed: int, steps: int,
              rows: int = 0) -> None:
  """nsl's side: the family's model and loss, nsl's optimizer, the dumped batches and blocks
  (`rows` > 0: only each batch's first `rows` rows)."""
  import jax
  import jax.numpy as jnp
  import optax
  from nsl.models import registry
  from nsl.nn import cross_entropy
  from nsl.train import state as train_state

  config = dd_port.load_config(model, **_schedule(steps))
  family = registry.get_family(config)
  params = _params(model, family, config, weights, init_seed)
  opt = train_state.make_optimizer(config)
  data = common.load_batches(batches)
  blocks = np.load(os.path.join(batches, "train_blocks.npy"))
  sed = np.load(os.path.join(batches, "sed_batches.npy")) if model == "sed" else None
  if rows:
    data = {k: v[:, :rows] for k, v in data.items()}
    sed = None if sed is None else sed[:, :, :rows]

  @jax.jit
  def step(p, o, arrays_):
    loss, grads = jax.value_and_grad(loss_fn)(p, arrays_)
    updates, o = opt.update(grads, o, p)
    return optax.apply_updates(p, updates), o, loss, optax.global_norm(grads)

  def loss_fn(p, arrays):  # the batch as arguments: one compile serves every step
    if model == "sed":
      enc, enc_seg, dec, dec_seg, targets, weights_ = arrays
      logits = family.model.apply({"params": p}, enc, enc_seg, dec, dec_seg)
      return cross_entropy.masked_cross_entropy(logits, targets, weights_)[0]
    tokens, segment, blk = arrays
    batch = {"tokens": tokens, "segment": segment}
    if model == "dd":
      _, targets, _, w = cross_entropy.next_token_targets(batch)
      return cross_entropy.masked_cross_entropy(family.token_logits(p, batch, block_BT=blk[None]), targets, w)[0]
    return family.loss(p, batch, jax.random.PRNGKey(0), 0)[0]

  def arrays(s):
    if model == "sed":
      inputs, targets, weights_ = dd_port.sed_inputs(sed[s])
      return tuple(jnp.asarray(a) for a in (*inputs, targets, weights_))
    b = dd_port.check_batch(data["tokens"][s])
    return jnp.asarray(b["tokens"]), jnp.asarray(b["segment"]), jnp.asarray(blocks[s], jnp.int32)

  o = opt.init(params)
  writer = common.CurveWriter(out)
  for s in range(steps):
    params, o, loss, gnorm = step(params, o, arrays(s))
    writer.write({"step": s + 1, "loss": float(loss), "grad_norm": float(gnorm)})
  writer.close()


FIXTURE = {"d_model": 64, "n_heads": 1, "d_ff": 256, "n_layers": 2, "vocab_size": 256, "mup_base_width": 32,
           "mup_base_head_dim": 32}  # m = 2, attention scale sqrt(32)/64: neither is the standard value
FIXTURE_ROWS, FIXTURE_SEQ = 2, 32


def fixture_config(model: str):
  """The fixture's nsl config: the tiny config shrunk to FIXTURE (their side: peer_dd.py --dim 64
  --enc 1 --dec 1 --vocab 256 --mup_base 32; heads d/64)."""
  over = {f"model.{k}": v for k, v in FIXTURE.items()}
  over["data.seq_len"] = FIXTURE_SEQ
  if model == "dd":
    over["double_decoder.gen_layers"] = 1
  return dd_port.load_config(model, **over)


def cmd_fixture(a) -> None:
  """tests/models/fixtures/dd_xcheck_{dd,dec}.npz: their fresh weights at the FIXTURE size (rounded
  to float16, so the file is small and exact), our check batch (random tokens with two EOS, a block
  draw) and their logits, loss and labels on it, for tests/models/test_dd_xcheck.py."""
  import jax
  from nsl.models import double_decoder as dd

  work = os.path.join(a.out, "fixture")
  os.makedirs(work, exist_ok=True)
  rng = np.random.default_rng(0)
  toks = rng.integers(1, FIXTURE["vocab_size"], (FIXTURE_ROWS, FIXTURE_SEQ + 1)).astype(np.int32)
  toks[0, 12], toks[1, 20] = 0, 0
  np.save(os.path.join(work, "check_tokens.npy"), toks)
  np.save(os.path.join(work, "check_blocks.npy"), np.asarray(dd.sample_blocks(jax.random.PRNGKey(5), FIXTURE_SEQ))[0])
  dest = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "models", "fixtures")
  os.makedirs(dest, exist_ok=True)
  for m in ("dd", "dec"):
    w = os.path.join(work, f"{m}.npz")
    _peer(a, "init", f"--model={m}", "--seed=0", f"--batches={work}", f"--out={w}", "--dim=64", "--enc=1", "--dec=1",
          "--vocab=256", "--mup_base=32", "--half")
    ref = dict(np.load(w))
    ref.update(__tokens=toks, __blocks=np.load(os.path.join(work, "check_blocks.npy")))
    ref["__logits"] = ref["__logits"].astype(np.float32)
    np.savez_compressed(os.path.join(dest, f"dd_xcheck_{m}.npz"), **ref)
    from nsl.models import registry
    config = fixture_config(m)
    family = registry.get_family(config)
    params = jax.tree.map(jax.numpy.asarray, dd_port.to_nsl(m, ref, config))
    print(m, json.dumps(dd_port.nsl_check(m, family, params, ref, toks, ref["__blocks"])))


def _peer(a, *args) -> None:
  cmd = ["nice", "-n", "10", a.peer_python, os.path.join(HERE, "peer_dd.py"), *args, f"--repo={a.repo}"]
  if a.stubs is not None:
    cmd.append(f"--stubs={a.stubs}")
  subprocess.run(cmd, check=True)


def _self(*args) -> None:
  subprocess.run(["nice", "-n", "10", sys.executable, os.path.abspath(__file__), *args], check=True)


def cmd_all(a) -> None:
  """Everything, resumably; `--sides=peer` / `--sides=nsl` run one side's queue (two processes, one
  per venv, can then share the machine). Order: every model's port check; the first model's
  ported runs and own-init seeds; the others' ported runs; their own-init seeds."""
  b = os.path.join(a.out, "batches")
  cmd_dump(b, a.data, a.steps)
  seeds = common.parse_seeds(a.seeds)
  lr = {m: float(dd_port.load_config(m).train.lr) for m in a.models}
  jobs = []
  for m in a.models:
    w = os.path.join(a.out, f"{m}_their_init_seed0.npz")
    if "peer" in a.sides:
      if m == "sed" and not os.path.exists(os.path.join(b, "sed_batches.npy")):
        _peer(a, "sed_batches", f"--batches={b}")
      if not os.path.exists(w):
        _peer(a, "init", f"--model={m}", "--seed=0", f"--batches={b}", f"--out={w}")
    if "nsl" in a.sides and os.path.exists(w):
      port = cmd_port(m, w, b)
      with open(os.path.join(a.out, f"{m}_port.json"), "w") as f:
        json.dump(port, f, indent=1)
      print(m, "port", json.dumps(port), flush=True)
    r = a.ported_rows.get(m, 0)
    rows = [f"--rows={r}"] if r else []
    jobs += [(m, "peer", ported_tag(r), ["--init=" + w, "--seed=0", *rows]),
             (m, "nsl", ported_tag(r), ["--weights=" + w, *rows])]
  own = {m: [(m, side, own_tag(s, a.own_rows), ([f"--seed={s}"] if side == "peer" else [f"--init_seed={s}"])
              + [f"--rows={a.own_rows}"]) for s in seeds for side in ("peer", "nsl")] for m in a.models}
  # the first model's own-init seeds right after its ported runs, then the others' ported runs
  jobs = jobs[:2] + own[a.models[0]] + jobs[2:] + [j for m in a.models[1:] for j in own[m]]
  for m, side, tag, extra in jobs:
    path = os.path.join(a.out, f"{m}_{side}_{tag}.jsonl")
    if side not in a.sides or common.finished(path, a.steps):
      continue
    common_args = [f"--model={m}", f"--batches={b}", f"--steps={a.steps}", f"--out={path}", *extra]
    if side == "peer":
      _peer(a, "train", f"--lr={lr[m]}", *common_args)
    else:
      _self("train", *common_args)
  print(json.dumps(summary(a.out, a.models, seeds, a.steps, a.own_rows, a.ported_rows), indent=1))


def own_tag(seed: int, rows: int) -> str:
  return f"seed{seed}" + (f"_rows{rows}" if rows else "")


def ported_tag(rows: int) -> str:
  return "ported" + (f"_rows{rows}" if rows else "")


def parse_rows(spec: str) -> dict[str, int]:
  """"dec:4" -> {"dec": 4, "sed": 4}."""
  return {m: int(r) for m, _, r in (part.partition(":") for part in spec.split(",") if part)}


def summary(out: str, models, seeds, steps: int, own_rows: int = 0, ported_rows=None) -> dict:
  res = {}
  for m in models:
    r = {}
    if os.path.exists(os.path.join(out, f"{m}_port.json")):
      with open(os.path.join(out, f"{m}_port.json")) as f:
        r["port"] = json.load(f)
    pr = (ported_rows or {}).get(m, 0)
    c = {k: os.path.join(out, f"{m}_{k}_{ported_tag(pr)}.jsonl") for k in ("peer", "nsl")}
    if all(common.finished(p, steps) for p in c.values()):
      gap = common.paired_gap(common.read_curve(c["nsl"]), common.read_curve(c["peer"]), 1, steps)
      gap["pass"] = gap["mean_abs"] <= MEAN_TOL and gap["worst_abs"] <= WORST_TOL
      gap["rows_per_batch"] = pr or "all"
      r["ported"] = gap
    sides = {}
    for side in ("nsl", "peer"):
      files = {s: os.path.join(out, f"{m}_{side}_{own_tag(s, own_rows)}.jsonl") for s in seeds}
      curves = {s: common.read_curve(f) for s, f in files.items() if common.finished(f, steps)}
      if len(curves) == len(seeds):
        sides[side] = common.seed_stats(curves, *WINDOW)
    if len(sides) == 2:
      r["own_init"] = {side: {k: v for k, v in st.items() if k != "mean_curve"} for side, st in sides.items()}
      r["own_init"]["rows_per_batch"] = own_rows or "all"
      r["own_init"]["nsl_minus_theirs"] = common.compare(sides["nsl"], sides["peer"], *WINDOW)
    res[m] = r
  with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(res, f, indent=1)
  plot(out, models, seeds, steps, own_rows, ported_rows or {})
  return res


def plot(out: str, models, seeds, steps: int, own_rows: int = 0, ported_rows=None) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(2, len(models), figsize=(4.2 * len(models), 6.4), squeeze=False)
  for j, m in enumerate(models):
    ax = axes[0, j]
    for side, col in (("peer", "tab:blue"), ("nsl", "tab:orange")):
      p = os.path.join(out, f"{m}_{side}_{ported_tag((ported_rows or {}).get(m, 0))}.jsonl")
      if os.path.exists(p):
        cur = common.read_curve(p)
        ax.plot(list(cur), list(cur.values()), color=col, lw=1, label=f"{'theirs' if side == 'peer' else 'nsl'}")
    pr = (ported_rows or {}).get(m, 0)
    ax.set_title(f"{m}: from their init (ported)" + (f", {pr} rows" if pr else ", 16 rows"), fontsize=9)
    ax.legend(fontsize=8)
    ax = axes[1, j]
    for side, col in (("peer", "tab:blue"), ("nsl", "tab:orange")):
      curves = []
      for s in seeds:
        p = os.path.join(out, f"{m}_{side}_{own_tag(s, own_rows)}.jsonl")
        if os.path.exists(p):
          cur = common.read_curve(p)
          curves.append([cur[k] for k in range(1, steps + 1)])
          ax.plot(list(cur), list(cur.values()), color=col, lw=0.4, alpha=0.35)
      if curves:  # the side's mean curve, a 10-step moving average
        mean = np.convolve(np.mean(curves, axis=0), np.ones(10) / 10, mode="valid")
        ax.plot(np.arange(10, steps + 1), mean, color=col, lw=1.6,
                label=f"{'theirs' if side == 'peer' else 'nsl'}: mean of {len(curves)}, 10-step average")
    ax.set_title(f"{m}: own init, seeds {seeds[0]}-{seeds[-1]}" + (f", {own_rows} rows" if own_rows else ""), fontsize=9)
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    for ax in axes[:, j]:
      ax.set_ylim(top=8.5)
  axes[0, 0].set_ylabel("train loss (nats)")
  axes[1, 0].set_ylabel("train loss (nats)")
  fig.tight_layout()
  fig.savefig(os.path.join(out, "dd_xcheck.png"), dpi=80)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("cmd", choices=("all", "dump", "port", "train", "summary", "fixture"))
  p.add_argument("--out", required=True, help="all/summary: the output directory; dump: the batch directory; train: the curve file")
  p.add_argument("--data", default="data/sotu-bpe4k")
  p.add_argument("--repo", help="a clone of the authors' repository (all)")
  p.add_argument("--peer_python", help="the torch venv's python (all)")
  p.add_argument("--stubs", default=None, help="peer_dd.py's --stubs (default: its tools/xcheck/peer_stubs)")
  p.add_argument("--models", default="dd,dec,sed")
  p.add_argument("--seeds", default="0-2")
  p.add_argument("--sides", default="peer,nsl", help="all: whose runs to do (peer, nsl or both)")
  p.add_argument("--own_rows", type=int, default=4,
                 help="all/summary: the own-init runs train on each batch's first N rows (0: all 16)")
  p.add_argument("--rows", type=int, default=0, help="train: each batch's first N rows (0: all)")
  p.add_argument("--ported_rows", default="dec:4",
                 help="all/summary: MODEL:N, the ported runs of MODEL train on each batch's first N rows")
  p.add_argument("--steps", type=int, default=STEPS)
  p.add_argument("--model", choices=tuple(dd_port.CONFIGS))
  p.add_argument("--batches", help="port/train: the dump directory")
  p.add_argument("--weights", default=None, help="port/train: their init .npz")
  p.add_argument("--init_seed", type=int, default=0)
  a = p.parse_args()
  a.models = [m for m in a.models.split(",") if m]
  a.ported_rows = parse_rows(a.ported_rows)
  if a.cmd in ("all", "fixture"):
    if not (a.repo and a.peer_python):
      p.error(f"{a.cmd} needs --repo and --peer_python")
  if a.cmd == "fixture":
    cmd_fixture(a)
  elif a.cmd == "all":
    os.makedirs(a.out, exist_ok=True)
    cmd_all(a)
  elif a.cmd == "dump":
    cmd_dump(a.out, a.data, a.steps)
  elif a.cmd == "port":
    print(json.dumps(cmd_port(a.model, a.weights, a.batches)))
  elif a.cmd == "train":
    cmd_train(a.model, a.batches, a.out, a.weights, a.init_seed, a.steps, a.rows)
  else:
    print(json.dumps(summary(a.out, a.models, common.parse_seeds(a.seeds), a.steps, a.own_rows, a.ported_rows),
                     indent=1))


if __name__ == "__main__":
  main()
