"""The NextLat authors' side of tools/xcheck/nextlat.py: their own model and training step (their
`models/model_nextlat.py`, read from --peer_dir at run time) on batches dumped by nsl.

Runs in a torch venv, never in nsl's. Two modes, both configured by BATCHES/meta.json (written by
`nextlat.py batches`: the tiny model, the optimiser settings, EOS id and context length):

  python peer_nextlat.py --peer_dir=PEER --batches=B --mode=init --seed=0 --out=B/peer_s0
      their freshly initialised weights (torch.manual_seed(seed), their constructor) as
      OUT.weights.npz, and on the first batch their logits (OUT.ref.npz) and loss terms
      (compute_loss without backward: next_token_loss, mse_loss, kl_loss) in OUT.ref.json
  python peer_nextlat.py --peer_dir=PEER --batches=B --mode=train --seed=0 --steps=300 --out=B/peer_s0
      their training from that initialisation on the dumped batches, one JSON line per step in
      OUT.jsonl: loss, ce (next_token_loss), next_h (mse_loss), kl (kl_loss), all before the step

Training is their path: Lightning Fabric on CPU (fp32), `NextLat.configure_optimizers` (AdamW,
decay on every >= 2-D tensor), `compute_loss(backpropagate=True)` (their two-stage backward),
`optimizer_step(grad_clip)` (Fabric's global-norm clipping), a constant learning rate.
"""

import argparse
import json
import os
import sys
import time

import numpy as np


def build(peer_dir: str, meta: dict, seed: int):
  import torch

  sys.path.insert(0, peer_dir)
  from models.model_nextlat import NextLat, NextLatConfig

  torch.manual_seed(seed)
  m = meta["model"]
  cfg = NextLatConfig(block_size=meta["seq_len"] + 1, vocab_size=m["vocab_size"], n_layer=m["n_layers"],
                      n_head=m["n_heads"], n_embd=m["d_model"], dropout=0.0, bias=False,
                      context_length=meta["context_length"], eos_token_id=meta["eos_id"],
                      lambda_kl=m["lambda_kl"], lambda_mse=m["lambda_h"], lambda_ce=0.0,
                      mtp_horizon=m["horizon"], proj_factor=m["proj_factor"])
  return NextLat(cfg)


def setup(model, meta: dict, with_optimizer: bool):
  import lightning as L

  t = meta["train"]
  if with_optimizer:
    model.configure_optimizers(weight_decay=t["weight_decay"], learning_rate=t["lr"], betas=(t["b1"], t["b2"]))
  fabric = L.Fabric(accelerator="cpu", devices=1, precision="32-true")
  model.setup_fabric(fabric)
  return fabric


def record(out: dict) -> dict:
  return {"loss": float(out["loss"]), "ce": float(out["next_token_loss"]), "next_h": float(out["mse_loss"]),
          "kl": float(out["kl_loss"])}


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--peer_dir", required=True, help="a directory holding their models/ (and utils/)")
  p.add_argument("--batches", required=True, help="the directory `nextlat.py batches` wrote")
  p.add_argument("--mode", choices=("init", "train"), required=True)
  p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before their constructor")
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--out", required=True, help="output prefix")
  a = p.parse_args()
  import torch

  torch.set_num_threads(1)
  with open(os.path.join(a.batches, "meta.json")) as f:
    meta = json.load(f)
  tokens = np.load(os.path.join(a.batches, "train_tokens.npy"))
  model = build(a.peer_dir, meta, a.seed)
  if a.mode == "init":
    sd = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.model.state_dict().items()}
    np.savez(a.out + ".weights.npz", **sd)
    setup(model, meta, with_optimizer=False)
    batch = torch.tensor(tokens[0], dtype=torch.long)
    model.eval()
    with torch.no_grad():
      logits = model.model(batch)  # lm_head of the final-normed states at every position
      terms = record(model.compute_loss(batch, backpropagate=False))
    np.savez(a.out + ".ref.npz", logits=logits.cpu().numpy().astype(np.float32))
    with open(a.out + ".ref.json", "w") as f:
      json.dump(terms, f)
    print(json.dumps(terms))
    return
  setup(model, meta, with_optimizer=True)
  model.train()
  clip = meta["train"]["clip_norm"]
  t0 = time.time()
  with open(a.out + ".jsonl", "w") as f:
    for s in range(min(a.steps, len(tokens))):
      out = model.compute_loss(torch.tensor(tokens[s], dtype=torch.long), backpropagate=True)
      model.optimizer_step(grad_clip=clip)
      rec = {"step": s + 1, **record(out), "sec": round(time.time() - t0, 2)}
      f.write(json.dumps(rec) + "\n")
      f.flush()
  print(json.dumps(rec))


if __name__ == "__main__":
  main()
