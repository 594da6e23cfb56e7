"""The SPS authors' own PyTorch models (github.com/lil-lab/sps) trained on nsl's dumped batches.

Run with the torch venv, never nsl's (tools/xcheck/README.md "SPS"); `tools/xcheck/sps.py` calls it:

  peer_sps.py --repo=PEER_REPO --model=sps|standard --batches=DIR --seed=0 --out=F.jsonl
  peer_sps.py ... --export_init=F.npz   # their freshly initialised weights, then exit (porting)

The model is built from their hydra config at the sps_tiny shape of configs/sps.py (d 128, 4 layers,
4 heads, SwiGLU 384, window 16, vocabulary 4096 + <predict> id 4096 + pad id 4097, padded to 4160,
EOS id 0, norm eps 1e-5 as nsl's) and initialised by their own code under torch.manual_seed(seed).
Optimiser as nsl's trainer: their configure_optimizers (AdamW (0.9, 0.95), decay 0.1 on every
tensor of rank >= 2), global-norm clip 1, lr = 3e-3 · min(1, s / 20) at optimiser step s = 0, 1, ...
(optax's linear warmup from 0, which nsl uses), then constant.

Their SPS training attention is Triton-only; on CPU the attention forward is swapped for their own
dense test reference (`_sdpa_reference_attention_sps`, fp32); their standard model's CPU fallback
(eager flex_attention) is swapped for causal SDPA, the same mask within a document (SOTU documents
are ~11k tokens, so nearly every row is one document; the SPS reference takes document ids).
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402  (numpy only)

PREDICT_ID, PAD_ID, VOCAB, EOS_ID = 4096, 4097, 4160, 0


def build(repo: str, model: str, window: int, seed: int):
  import torch
  sys.path.insert(0, os.path.join(repo, "src"))
  sys.path.insert(0, repo)
  from hydra import compose, initialize_config_dir
  from hydra.utils import instantiate

  ov = [f"model={model}", "model.config.n_layer=4", "model.config.n_head=4", "model.config.hidden_size=128",
        "model.config.intermediate_size=384", f"model.config.vocab_size={VOCAB}", f"model.config.eos_token_id={EOS_ID}",
        f"model.config.pad_token_id={PAD_ID}", "model.config.block_size=256", "model.config.norm_eps=1e-5"]
  if model == "sps":
    ov += [f"model.config.window_size={window}", f"model.config.predict_token_id={PREDICT_ID}"]
  with initialize_config_dir(config_dir=os.path.join(repo, "conf"), version_base=None):
    cfg = compose(config_name="config", overrides=ov)
  _patch_cpu_attention(model)
  torch.manual_seed(seed)
  return instantiate(cfg.model).to("cpu").train()


def _patch_cpu_attention(model: str) -> None:
  import torch
  if model == "sps":
    import modeling.models.sps.core as sps_core
    from modeling.models.model import apply_rotary_emb
    ref = _reference_attention(sps_core.__file__)

    def forward(self, x, freqs_cis, documents_idx_Bx2T=None):  # their forward minus the bf16/Triton call
      b, two_t, c = x.size()
      q, k, v = self.c_attn(x).split(self.hidden_size, dim=2)
      q = q.view(b, two_t, self.n_head, c // self.n_head)
      k = k.view(b, two_t, self.n_head, c // self.n_head)
      v = v.view(b, two_t, self.n_head, c // self.n_head).transpose(1, 2)
      q, k = apply_rotary_emb(q, k, freqs_cis=freqs_cis)
      y = ref(q.transpose(1, 2), k.transpose(1, 2), v, self.window_size, documents_idx_BxT=documents_idx_Bx2T)
      y = y.transpose(1, 2).contiguous().view(b, two_t, c).to(self.c_proj.weight.dtype)
      return self.resid_dropout(self.c_proj(y))
    sps_core.SPSFlashAttention.forward = forward
  else:
    import torch.nn.functional as F
    import modeling.models.model as model_lib
    orig_init = model_lib.CausalSelfAttention.__init__

    def init(self, config):
      orig_init(self, config)
      self.flex_attention_fn = lambda q, k, v, block_mask=None: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    model_lib.CausalSelfAttention.__init__ = init
  torch.set_num_threads(1)


def _reference_attention(core_file: str):
  """Their dense SPS attention reference, `_sdpa_reference_attention_sps` of their Triton test
  module, loaded from their checkout alone: the module imports triton at the top (absent on CPU,
  and a stand-in module breaks torch), the function needs only torch."""
  import ast
  import torch
  path = os.path.join(os.path.dirname(core_file), "..", "..", "tests", "attention", "triton", "test_sps_attention.py")
  tree = ast.parse(open(path).read())
  fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_sdpa_reference_attention_sps"]
  scope = {"torch": torch}
  exec(compile(ast.Module(body=fn, type_ignores=[]), path, "exec"), scope)
  return scope["_sdpa_reference_attention_sps"]


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--repo", required=True, help="a checkout of github.com/lil-lab/sps")
  p.add_argument("--model", required=True, choices=("sps", "standard"))
  p.add_argument("--batches", required=True, help="the directory common.dump_batches wrote")
  p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before their init")
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--window", type=int, default=16)
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--warmup", type=int, default=20)
  p.add_argument("--out", help="the per-step curve (jsonl)")
  p.add_argument("--export_init", help="write their initial weights here (.npz, torch names) and exit")
  a = p.parse_args()
  import numpy as np
  import torch

  model = build(a.repo, a.model, a.window, a.seed)
  if a.export_init:
    np.savez(a.export_init, **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    return
  opt = model.configure_optimizers(0.1, a.lr, (0.9, 0.95), "cpu")
  toks = common.load_batches(a.batches)["tokens"]
  out, t0 = common.CurveWriter(a.out), time.time()
  for s in range(a.steps):
    for g in opt.param_groups:
      g["lr"] = a.lr * min(1.0, s / a.warmup)
    x = torch.tensor(toks[s][:, :-1], dtype=torch.long)
    y = torch.tensor(toks[s][:, 1:], dtype=torch.long)
    _, loss, _ = model(x, y.clone())
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    out.write({"step": s + 1, "loss": float(loss.detach()), "grad_norm": float(gnorm), "sec": round(time.time() - t0, 2)})
  out.close()


if __name__ == "__main__":
  main()
