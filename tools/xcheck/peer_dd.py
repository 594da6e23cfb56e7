"""The double-decoder authors' side of the cross-check (tools/xcheck/dd.py drives it; README there).

Runs in the torch venv and imports the authors' own modules from --repo (a clone of
github.com/ashlab11/block-based-double-decoder; nothing of theirs is copied here): their
`scripts/parallel_scaling.py` builds the models (`build_model`: heads d/64, μP base width 64 and
base head size 64, xavier-uniform init, SED with 3/4 of the decoder layers), the optimizer
(`build_optimizer`: AdamW groups embedding / hidden (LR × 64/d) / norms) and the schedule
(`build_scheduler`: 5% warmup, linear decay to 10%); their collators make the labels (and SED's
span corruption). Their script imports `datasets` and `transformers` at module level for data
loading this driver never does: both are stubbed in sys.modules. torchtune is needed for RoPE
(`pip install --no-deps torchtune==0.6.0`; its package import wants torchao's nf4tensor, so by
default --stubs=tools/xcheck/peer_stubs puts first on the path a `torchtune.modules` that loads
torchtune's own position_embeddings.py alone).

  init  --model=dd|dec|sed --seed=S --batches=DIR --out=W.npz   their fresh weights (state_dict)
        plus their logits and loss on DIR/check_*.npy (the port check's reference)
  sed_batches --batches=DIR   their span corruption of the dumped rows -> DIR/sed_batches.npy
  train --model=... (--init=W.npz | --seed=S) --batches=DIR --steps=300 --out=C.jsonl
        their optimizer, schedule and step on the dumped batches (and blocks); one JSON line a step

Tiny config (mirrors configs/dd.py:*_tiny): d 128, 2 + 1 layers (decoder-only 3), vocab 4096
(SED 4224: 100 sentinels from 4096, pad 4196, decoder start 4197), sequence 128, batch 16.
"""
import argparse
import json
import math
import os
import sys
import time
import types

import numpy as np

DIM, ENC, DEC, VOCAB, SED_VOCAB = 128, 2, 1, 4096, 4224
EOS = 0  # nsl's BPE-4096 EOS id; the dumped data has no BOS (an id nothing uses stands in)
NO_BOS = -1
SENTINEL0, PAD, SED_START = 4096, 4196, 4197


def load_theirs(repo: str, stubs: str | None):
  if stubs:
    sys.path.insert(0, stubs)
  sys.path.insert(0, repo)
  sys.path.insert(0, os.path.join(repo, "scripts"))
  for name, attrs in (("datasets", ("load_dataset",)), ("transformers", ("PreTrainedTokenizerFast",))):
    if name not in sys.modules:
      mod = types.ModuleType(name)
      for a in attrs:
        setattr(mod, a, None)
      sys.modules[name] = mod
  import parallel_scaling as ps
  return ps


def build(ps, model: str, seed: int, a=None):
  """Their model, built by their build_model after torch.manual_seed(seed). `a` may shrink it
  (the test fixture: --dim, --enc, --dec, --vocab, --mup_base, their module constants)."""
  import torch
  dim, enc, dec = (a.dim, a.enc, a.dec) if a else (DIM, ENC, DEC)
  vocab = a.vocab if a and a.vocab else (SED_VOCAB if model == "sed" else VOCAB)
  if a and a.mup_base:
    ps.MUP_BASE_DIM = ps.MUP_BASE_HEAD_DIM = a.mup_base
  torch.manual_seed(seed)
  arch = {"dim": dim, "num_encoder_layers": enc, "num_decoder_layers": dec}
  return ps.build_model(model, arch, vocab, "cpu", use_compile=False, grad_ckpt=False)


def collate(model: str, tokens_BT1, blocks_T=None, seed: int = 0):
  """Their collator's batch for nsl's rows of T + 1 tokens: DD/decoder-only see the first T
  tokens with labels from the collator (the next token; -100 after BOS/EOS inputs), SED the
  span-corrupted first T tokens."""
  import torch
  rows = [{"input_ids": [int(t) for t in r]} for r in tokens_BT1]
  if model == "sed":
    from collators.encoder_decoder.pretrain import EDPretrainCollator
    t = tokens_BT1.shape[1] - 1
    col = EDPretrainCollator(max_seq_len=t, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=SED_START,
                             sentinel_start_id=SENTINEL0, global_seed=seed)
    return col([{"input_ids": r["input_ids"][:t]} for r in rows])
  if model == "dd":
    from collators.double_decoder.pretrain import DDPretrainCollator
    col = DDPretrainCollator(max_seq_len=tokens_BT1.shape[1], bos_token_id=NO_BOS, eos_token_id=EOS)
  else:
    from collators.decoder.pretrain import DecoderPretrainCollator
    col = DecoderPretrainCollator(bos_token_id=NO_BOS, eos_token_id=EOS)
  out = col(rows)
  batch = {"input_ids": out["input_ids"][:, :-1].contiguous(), "labels": out["labels"][:, :-1].contiguous()}
  if model == "dd":
    bounds = np.nonzero(np.diff(np.asarray(blocks_T)))[0] + 1
    batch.update(blocks=torch.as_tensor(bounds, dtype=torch.long), sft=False)
  return batch


def forward(ps, net, model, batch):
  return ps.model_forward(net, batch, model != "dec")


def cmd_init(a, ps):
  import torch
  net = build(ps, a.model, a.seed, a)
  if a.half:  # weights exactly representable in float16 (a small fixture file), logits from those
    with torch.no_grad():
      for v in net.parameters():
        v.copy_(v.half().float())
  state = {k: v.detach().numpy().astype(np.float16 if a.half else np.float32) for k, v in net.state_dict().items()
           if not k.endswith(".cache")}
  tokens = np.load(os.path.join(a.batches, "check_tokens.npy"))
  blocks = np.load(os.path.join(a.batches, "check_blocks.npy"))
  batch = collate(a.model, tokens, blocks, seed=a.seed)
  if a.model == "sed":
    batch = sed_batch(sed_arrays(batch))  # the decoder positions 0..T-1 as in training
  with torch.no_grad():
    out = forward(ps, net.eval(), a.model, batch)
  extra = {"__logits": out["logits"].numpy(), "__loss": np.float64(out["loss"].item()),
           "__labels": batch["labels"].numpy()}
  if a.model == "sed":
    extra["__sed"] = sed_arrays(batch)
  np.savez(a.out, **state, **extra)
  print(json.dumps({"model": a.model, "seed": a.seed, "loss": float(out["loss"]), "tensors": len(state)}))


def cmd_train(a, ps):
  import torch
  torch.set_num_threads(a.threads)
  net = build(ps, a.model, a.seed, a)
  if a.init:
    w = np.load(a.init)
    net.load_state_dict({k: torch.tensor(w[k]) for k in net.state_dict() if not k.endswith(".cache")}, strict=False)
  net.train()
  ps.LR_OVERRIDE, ps.WD_OVERRIDE = a.lr, a.wd
  opt = ps.build_optimizer(net, a.dim, a.model)
  sched = ps.build_scheduler(opt, a.steps)
  toks = np.load(os.path.join(a.batches, "train_tokens.npy"))
  blocks = np.load(os.path.join(a.batches, "train_blocks.npy"))
  sed = np.load(os.path.join(a.batches, "sed_batches.npy")) if a.model == "sed" else None
  if a.rows:  # only each batch's first rows (the own-init runs: docs/xcheck/dd.md)
    toks = toks[:, :a.rows]
    sed = None if sed is None else sed[:, :, :a.rows]
  tmp = a.out + ".part"
  t0 = time.time()
  with open(tmp, "w") as f:
    for s in range(a.steps):
      batch = sed_batch(sed[s]) if a.model == "sed" else collate(a.model, toks[s], blocks[s])
      out = forward(ps, net, a.model, batch)
      n_valid = int((batch["labels"] != -100).sum())
      (out["loss"] * n_valid).backward()
      for p in net.parameters():  # their loop: sum of per-token losses, then / n_valid
        if p.grad is not None:
          p.grad.mul_(1.0 / n_valid)
      gn = torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
      opt.step()
      sched.step()
      opt.zero_grad(set_to_none=True)
      f.write(json.dumps({"step": s + 1, "loss": float(out["loss"].detach()), "grad_norm": float(gn),
                          "sec": round(time.time() - t0, 2)}) + "\n")
      f.flush()
  os.replace(tmp, a.out)
  print(json.dumps({"model": a.model, "out": a.out, "sec": round(time.time() - t0, 1)}))


SED_KEYS = ("encoder_input_ids", "decoder_input_ids", "labels")


def sed_arrays(batch):
  """Their SED batch as one int array [4, B, L]: encoder ids, decoder ids, labels, encoder lengths."""
  lens = np.broadcast_to(batch["blocks"].numpy()[:, None], batch["labels"].shape)
  return np.stack([batch[k].numpy() for k in SED_KEYS] + [lens]).astype(np.int32)


def sed_batch(arr):
  import torch
  batch = {k: torch.as_tensor(arr[i], dtype=torch.long) for i, k in enumerate(SED_KEYS)}
  t = arr.shape[-1]
  batch.update(blocks=torch.as_tensor(arr[3][:, 0], dtype=torch.long), sft=True,
               decoder_input_positions=torch.arange(t).expand(arr.shape[1], t))
  return batch


def cmd_sed_batches(a, ps):
  """Their span corruption (EDPretrainCollator, seed data_seed·1000 + step) of every dumped
  training row, for both sides to train on: sed_batches.npy [steps, 4, B, T] int32."""
  toks = np.load(os.path.join(a.batches, "train_tokens.npy"))
  out = np.stack([sed_arrays(collate("sed", toks[s], seed=1000 * a.data_seed + s)) for s in range(len(toks))])
  np.save(os.path.join(a.batches, "sed_batches.npy"), out)
  print(json.dumps({"sed_batches": list(out.shape)}))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("cmd", choices=("init", "train", "sed_batches"))
  p.add_argument("--repo", required=True, help="a clone of the authors' repository")
  p.add_argument("--stubs", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_stubs"),
                 help="a directory with a torchtune.modules stand-in (default tools/xcheck/peer_stubs; '' for the real one)")
  p.add_argument("--model", default="sed", choices=("dd", "dec", "sed"))
  p.add_argument("--batches", required=True)
  p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building the model")
  p.add_argument("--data_seed", type=int, default=0, help="SED: the collator's span-corruption seed")
  p.add_argument("--init", default=None, help="weights .npz (from init) instead of a fresh model")
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--lr", type=float, default=0.01)
  p.add_argument("--wd", type=float, default=0.5)
  p.add_argument("--threads", type=int, default=1)
  p.add_argument("--rows", type=int, default=0, help="train: each batch's first N rows (0: all)")
  p.add_argument("--out", default=None)
  p.add_argument("--dim", type=int, default=DIM)
  p.add_argument("--enc", type=int, default=ENC)
  p.add_argument("--dec", type=int, default=DEC)
  p.add_argument("--vocab", type=int, default=0, help="0: 4096 (SED 4224)")
  p.add_argument("--mup_base", type=int, default=0, help="their MUP_BASE_DIM and MUP_BASE_HEAD_DIM (0: 64)")
  p.add_argument("--half", action="store_true", help="init: round the weights to float16 (the test fixture)")
  a = p.parse_args()
  ps = load_theirs(a.repo, a.stubs)
  {"init": cmd_init, "train": cmd_train, "sed_batches": cmd_sed_batches}[a.cmd](a, ps)


if __name__ == "__main__":
  main()
