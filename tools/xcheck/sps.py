"""SPS against its authors' code (github.com/lil-lab/sps), from each side's own initialisation.

One command, from the nsl repository root with nsl's venv (tools/xcheck/README.md "SPS"):

  .venv/bin/python tools/xcheck/sps.py --peer_repo=PEER_REPO --peer_python=PEER_VENV/bin/python \\
      --out=runs/xcheck/sps [--seeds=0-4] [--models=sps,standard] [--port] [--init_stats]

1. dumps the first 300 batches nsl's trainer draws for configs/sps.py:sps_tiny (seq 128, batch 16,
   the embedded SOTU BPE-4k corpus, data seed 0) to OUT/batches (common.dump_batches);
2. trains, on exactly those batches, the authors' SPS and standard from THEIR initialisation with
   torch seeds SEEDS (peer_sps.py, the torch venv) and nsl's from nsl's initialisation with
   config.init_seed = SEEDS (sps_nsl.py), the data order fixed: --jobs_per_side processes per side at a time
   (default 1), one thread each, niced; a finished run's OUT/<side>_<model>_s<seed>.jsonl is kept (rerun = resume);
3. prints (and writes OUT/summary.json) per side and model the per-seed mean loss over steps
   50-300, the mean curve, sd and standard error across seeds, and per model the difference of
   the mean curves (nsl - authors, mean over 50-300) with its standard error and the verdict of
   issue #45 (|Δ| <= 0.04, or <= 2 se).

--port also trains nsl from the authors' seed-0 weights ported into nsl (sps_nsl.port) and reports
its gap to the authors' seed-0 curve step by step (mean / worst |Δ| over steps 1-300; step 1's is
the loss of the same weights on the same batch). --init_stats writes both sides' per-tensor
step-0 statistics (OUT/init_stats_<model>.json). --nsl_label/--nsl_arg run nsl with extra config
overrides under another name (e.g. an initialisation option), compared like the default.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

LO = 50  # the seed comparison averages over steps LO..--hi (issue #45: 50-300)
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}


def run_jobs(jobs: list[tuple[list[str], str]], log) -> list[str]:
  """Runs (command, curve path) jobs one after another, niced, skipping finished curves; returns
  the failures."""
  failed = []
  for cmd, path in jobs:
    if os.path.exists(path):
      continue
    log(f"start {os.path.basename(path)}")
    with open(path + ".log", "w") as f:
      rc = subprocess.call(["nice", "-n", "10"] + cmd, stdout=f, stderr=subprocess.STDOUT,
                           env={**os.environ, **THREAD_ENV})
    log(f"{'done ' if rc == 0 else 'FAILED'} {os.path.basename(path)}" + ("" if rc == 0 else f" (see {path}.log)"))
    if rc:
      failed.append(path)
  return failed


def curves(out: str, side: str, model: str, seeds: list[int], hi: int) -> dict[int, dict[int, float]]:
  """The finished curves of `side` that reach step `hi` (a longer run counts too)."""
  paths = {s: os.path.join(out, f"{side}_{model}_s{s}.jsonl") for s in seeds}
  return {s: common.read_curve(p) for s, p in paths.items() if common.finished(p, hi)}


def summarize(out: str, models: list[str], seeds: list[int], hi: int, nsl_sides: list[str], port: bool) -> dict:
  summary: dict = {"steps": [LO, hi], "models": {}}
  for model in models:
    entry: dict = {}
    for side in ["peer"] + nsl_sides:
      c = curves(out, side, model, seeds, hi)
      if c:
        entry[side] = common.seed_stats(c, LO, hi)
        entry[side]["curves"] = [[round(c[s][t], 4) for t in range(LO, hi + 1)] for s in sorted(c)]
    for side in nsl_sides:
      if side in entry and "peer" in entry:
        entry[f"{side}_vs_peer"] = common.compare(entry[side], entry["peer"], LO, hi)
    port_path = os.path.join(out, f"port_{model}.jsonl")
    peer0 = os.path.join(out, f"peer_{model}_s0.jsonl")
    if port and os.path.exists(port_path) and os.path.exists(peer0):
      a, b = common.read_curve(port_path), common.read_curve(peer0)
      entry["ported"] = {**common.paired_gap(a, b, 1, hi), "step1_abs": round(abs(a[1] - b[1]), 6)}
    summary["models"][model] = entry
  return summary


def init_stats(args, model: str, peer_npz: str) -> None:
  """Both sides' step-0 parameters, per tensor (nsl's names; the authors' mapped by sps_nsl.port)."""
  import numpy as np
  import sps_nsl
  path = os.path.join(args.out, f"init_stats_{model}.json")
  nsl_path = os.path.join(args.out, f"init_stats_{model}_nsl.json")
  subprocess.check_call([sys.executable, os.path.join(HERE, "sps_nsl.py"), f"--model={model}",
                         f"--batches={args.out}/batches", "--init_seed=0", f"--init_stats={nsl_path}"] + args.nsl_arg,
                        env={**os.environ, **THREAD_ENV})
  with open(nsl_path) as f:
    ours = json.load(f)
  import jax
  from nsl.train import program  # the parameter tree to port onto
  config = sps_nsl.make_config(model, 0, 300, [])
  abstract = program.Program(config, jax.devices()[:1]).abstract_state.params
  zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), abstract)
  theirs = sps_nsl.port(dict(np.load(peer_npz)), zeros)
  flat = jax.tree_util.tree_flatten_with_path(theirs)[0]
  named = [("/".join(str(getattr(k, "key", k)) for k in p), v) for p, v in flat]
  peer = common.tensor_stats(named)
  rows = {k: {"nsl": ours[k], "peer": peer.get(k)} for k in ours}
  with open(path, "w") as f:
    json.dump(rows, f, indent=1)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--peer_repo", required=True, help="a checkout of github.com/lil-lab/sps (read, never copied)")
  ap.add_argument("--peer_python", required=True, help="python of a venv with torch (CPU), numpy, hydra-core")
  ap.add_argument("--out", default="runs/xcheck/sps")
  ap.add_argument("--seeds", default="0-4")
  ap.add_argument("--models", default="sps,standard")
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--sides", default="peer,nsl", help="which sides to train now (the summary reads all)")
  ap.add_argument("--port", action="store_true", help="also train nsl from the authors' seed-0 weights")
  ap.add_argument("--init_stats", action="store_true", help="write both sides' step-0 parameter statistics")
  ap.add_argument("--nsl_label", default="nsl", help="name of this nsl variant's curves (nsl_<label> if not nsl)")
  ap.add_argument("--nsl_arg", action="append", default=[], help="extra --config.KEY=VALUE for nsl (repeatable)")
  ap.add_argument("--compare", default="", help="more nsl labels already trained, summarised beside")
  ap.add_argument("--summary_only", action="store_true")
  ap.add_argument("--hi", type=int, default=0, help="last step of the compared window (default --steps)")
  ap.add_argument("--plot", help="write the mean curves (both sides, every model) to this PNG")
  ap.add_argument("--jobs_per_side", type=int, default=1,
                  help="training processes per side at once (one thread each); 1 keeps the two sides' load equal")
  args = ap.parse_args()
  for p in (args.peer_repo, args.peer_python):
    if not os.path.exists(p):
      print(f"error: {p} does not exist", file=sys.stderr)
      sys.exit(2)
  seeds, models = common.parse_seeds(args.seeds), args.models.split(",")
  side = args.nsl_label if args.nsl_label == "nsl" else f"nsl_{args.nsl_label}"
  batches = os.path.join(args.out, "batches")
  log = lambda msg: print(msg, file=sys.stderr, flush=True)
  os.makedirs(args.out, exist_ok=True)
  if not args.summary_only:
    import sps_nsl
    common.dump_batches(sps_nsl.make_config("sps", 0, args.steps, []), batches, args.steps)
    peer_cmd = lambda model, seed, *extra: [args.peer_python, os.path.join(HERE, "peer_sps.py"),
                                            f"--repo={args.peer_repo}", f"--model={model}", f"--batches={batches}",
                                            f"--seed={seed}", f"--steps={args.steps}", *extra]
    nsl_cmd = lambda model, seed, *extra: [sys.executable, os.path.join(HERE, "sps_nsl.py"), f"--model={model}",
                                           f"--batches={batches}", f"--init_seed={seed}", f"--steps={args.steps}",
                                           *extra, *args.nsl_arg]
    queues: dict[str, list] = {"peer": [], "nsl": []}
    # Model-major (SPS first, as --models lists them): SPS's seed spread is the larger, so its five
    # seeds come before standard's when the run is cut short.
    for model in models:
      for seed in seeds:
        queues["peer"].append((peer_cmd(model, seed, f"--out={args.out}/peer_{model}_s{seed}.jsonl"),
                               f"{args.out}/peer_{model}_s{seed}.jsonl"))
        queues["nsl"].append((nsl_cmd(model, seed, f"--out={args.out}/{side}_{model}_s{seed}.jsonl"),
                              f"{args.out}/{side}_{model}_s{seed}.jsonl"))
    for model in models if (args.port or args.init_stats) else []:
      npz = os.path.join(args.out, f"peer_{model}_init_s0.npz")
      if not os.path.exists(npz):
        subprocess.check_call(peer_cmd(model, 0, f"--export_init={npz}"), env={**os.environ, **THREAD_ENV},
                              stdout=subprocess.DEVNULL)
      if args.init_stats:
        init_stats(args, model, npz)
      if args.port:
        queues["nsl"].append((nsl_cmd(model, 0, f"--init_from={npz}", f"--out={args.out}/port_{model}.jsonl"),
                              f"{args.out}/port_{model}.jsonl"))
    wanted = args.sides.split(",")
    failed: list[str] = []
    lock = threading.Lock()

    def worker(q):  # pops jobs off its side's queue (list.pop is atomic) until none is left
      while True:
        try:
          job = q.pop(0)
        except IndexError:
          return
        bad = run_jobs([job], log)
        with lock:
          failed.extend(bad)
    threads = [threading.Thread(target=worker, args=(q,))
               for name, q in queues.items() if name in wanted for _ in range(args.jobs_per_side)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    if failed:
      log(f"{len(failed)} run(s) failed: {', '.join(failed)}")
  nsl_sides = [side] + [f"nsl_{x}" for x in args.compare.split(",") if x]
  summary = summarize(args.out, models, seeds, args.hi or args.steps, nsl_sides, args.port)
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  brief = {m: {k: ({kk: vv for kk, vv in v.items() if kk not in ("mean_curve", "curves")} if isinstance(v, dict) else v)
               for k, v in e.items()} for m, e in summary["models"].items()}
  print(json.dumps(brief, indent=1))
  if args.plot:
    plot(summary, args.plot)


def plot(summary: dict, path: str) -> None:
  """Per model: both sides' mean curves (per-seed curves faint) and, below, each nsl side's mean
  curve minus the authors' (the same batches at every step, so the shared batch noise cancels)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  models = summary["models"]
  fig, axes = plt.subplots(2, len(models), figsize=(5.2 * len(models), 5.6), squeeze=False,
                           gridspec_kw={"height_ratios": [2, 1]}, sharex="col")
  for col, (model, entry) in enumerate(models.items()):
    top, bottom = axes[0][col], axes[1][col]
    peer = entry.get("peer")
    for side, st in entry.items():
      if not isinstance(st, dict) or "mean_curve" not in st:
        continue
      lo, hi = st["steps"]
      x, m = np.arange(lo, hi + 1), np.array(st["mean_curve"])
      label = {"peer": "authors' code"}.get(side, side) + f" ({len(st['seeds'])} seeds)"
      line, = top.plot(x, m, lw=1.2, label=label)
      for c in st.get("curves", []):
        top.plot(x, c, lw=0.4, alpha=0.35, color=line.get_color())
      if side != "peer" and peer is not None:
        d = m - np.array(peer["mean_curve"])
        bottom.plot(x, d, lw=1.0, color=line.get_color(), label=f"{side} - authors (mean {d.mean():+.3f})")
    top.set_title(f"{model}: training loss on identical batches")
    top.set_ylabel("loss (nats)")
    top.legend(fontsize=8)
    bottom.axhline(0, color="k", lw=0.5)
    for y in (-0.04, 0.04):
      bottom.axhline(y, color="grey", lw=0.5, ls="--")
    bottom.set_xlabel("step")
    bottom.set_ylabel("Δ mean curve")
    bottom.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


if __name__ == "__main__":
  main()
