"""nsl's side of the SPS cross-check: configs/sps.py's sps_tiny / standard_tiny trained by nsl's own
compiled train step (`nsl.train.program.Program`, the trainer's) on the dumped batches.

Run with nsl's venv from the repository root; `tools/xcheck/sps.py` calls it:

  sps_nsl.py --model=sps|standard --batches=DIR --init_seed=0 --out=F.jsonl
  sps_nsl.py ... --init_from=F.npz     # start from the authors' weights (peer_sps.py --export_init)
  sps_nsl.py ... --init_stats=F.json   # per-tensor statistics of the step-0 parameters, then exit

Training matches peer_sps.py: 300 steps, lr 3e-3 with nsl's 20-step linear warmup from 0 then
constant (train.decay_steps=0), AdamW (0.9, 0.95), decay 0.1, clip 1, fp32; `config.seed` = 0 and
the batches fixed, so only `config.init_seed` varies between seeds. Extra `--config.KEY=VALUE`
arguments are applied last (e.g. an initialisation option under test).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402

import numpy as np  # noqa: E402


def make_config(model: str, init_seed: int, steps: int, extra: list[tuple[str, str]]):
  from nsl import config as nsl_config
  overrides = [("seed", "0"), ("init_seed", str(init_seed)), ("train.steps", str(max(steps, 21))),  # the lr is constant after warmup
               ("train.warmup_steps", "20"), ("train.decay_steps", "0"), ("train.lr", "3e-3"),
               ("model.dtype", "float32")] + extra
  return nsl_config.load_config(f"configs/sps.py:{model}_tiny", overrides)


def port(their: dict[str, np.ndarray], params) -> dict:
  """The authors' state dict (torch names, Linear weights [out, in]) -> nsl's parameter tree
  (`embed`, `trunk/block_i/{attn, attn_norm, mlp, mlp_norm}`, `trunk/final_norm`). Their RoPE
  rotates adjacent pairs (2i, 2i+1) of a head, nsl's the halves (i, i + hd/2): the q and k head
  dims are permuted accordingly, which leaves every q·k unchanged."""
  import jax
  shapes = jax.tree.map(lambda x: x.shape, params)
  d, h, hd = shapes["trunk"]["block_0"]["attn"]["wq"]
  perm = np.concatenate([np.arange(0, hd, 2), np.arange(1, hd, 2)])  # nsl dim j <- their dim perm[j]
  t = lambda name: np.asarray(their[name], np.float32)
  trunk = {"final_norm": {"scale": t("transformer.output_norm.weight")}}
  for i in range(sum(k.startswith("block_") for k in shapes["trunk"])):
    pre = f"transformer.h.{i}."
    q, k, v = np.split(t(pre + "attn.c_attn.weight"), 3, axis=0)  # each [d_out, d_in]
    heads = lambda w: w.T.reshape(d, h, hd)
    trunk[f"block_{i}"] = {
        "attn": {"wq": heads(q)[:, :, perm], "wk": heads(k)[:, :, perm], "wv": heads(v),
                 "wo": t(pre + "attn.c_proj.weight").T.reshape(h, hd, d)},
        "attn_norm": {"scale": t(pre + "attention_norm.weight")},
        "mlp": {"w_gate": t(pre + "mlp.gate_proj.weight").T, "w_up": t(pre + "mlp.up_proj.weight").T,
                "w_down": t(pre + "mlp.down_proj.weight").T},
        "mlp_norm": {"scale": t(pre + "mlp_norm.weight")},
    }
  new = {"embed": {"embedding": t("transformer.wte.weight")}, "trunk": trunk}
  if jax.tree.map(lambda x: x.shape, new) != shapes:
    raise ValueError("the authors' weights do not map onto this config's parameter shapes")
  return new


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", required=True, choices=("sps", "standard"))
  ap.add_argument("--batches", required=True)
  ap.add_argument("--init_seed", type=int, default=0)
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--out")
  ap.add_argument("--init_from", help="the authors' initial weights (.npz from peer_sps.py --export_init)")
  ap.add_argument("--init_stats", help="write per-tensor statistics of the step-0 parameters here and exit")
  a, rest = ap.parse_known_args()
  from nsl import config as nsl_config
  extra, unknown = nsl_config.split_overrides(rest)
  if unknown:
    ap.error(f"unrecognized arguments: {' '.join(unknown)}")

  import jax
  import jax.numpy as jnp
  from nsl.train import program as program_lib
  from nsl.train import state as train_state

  config = make_config(a.model, a.init_seed, a.steps, extra)
  prog = program_lib.Program(config, jax.devices()[:1])
  with prog.mesh_context():
    state = prog.init(jax.random.PRNGKey(nsl_config.init_seed(config)))
    if a.init_from:
      params = port(dict(np.load(a.init_from)), state.params)
      state = jax.jit(lambda p: train_state.create(p, prog.optimizer), out_shardings=prog.state_sharding)(params)
    if a.init_stats:
      flat = jax.tree_util.tree_flatten_with_path(jax.device_get(state.params))[0]
      named = [("/".join(str(getattr(k, "key", k)) for k in path), v) for path, v in flat]
      with open(a.init_stats, "w") as f:
        json.dump(common.tensor_stats(named), f, indent=1)
      return
    toks = common.load_batches(a.batches)
    rng = jax.random.fold_in(jax.random.PRNGKey(config.seed), 1)  # as the trainer's base_rng
    out, t0 = common.CurveWriter(a.out), time.time()
    for s in range(a.steps):
      batch = {"tokens": jnp.asarray(toks["tokens"][s]), "segment": jnp.asarray(toks["segment"][s])}
      state, m = prog.train_step(state, batch, rng, prog.schedule)
      m = jax.device_get(m)
      out.write({"step": s + 1, "loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]),
                 "sec": round(time.time() - t0, 2)})
  out.close()


if __name__ == "__main__":
  main()
