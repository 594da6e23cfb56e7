"""Shared defaults for every nsl config (configs-as-code: other files import and edit these).

`get_config()` is a complete, valid config built from the option schemas (`nsl.options.base_config`,
docs/reference/config.md): a small standard transformer on the embedded default corpus (State of
the Union speeches, BPE 4096), every field present so any can be overridden from the command line.
Experiment files start from it and change only what differs. `paper_recipe` applies the SPS
paper's training recipe (docs/papers/sps.md#training).
"""

import ml_collections

from nsl import options

DEFAULT_RULES = options.DEFAULT_RULES  # the one sharding table (docs/design.md#sharding)


def get_config() -> ml_collections.ConfigDict:
  return options.base_config()


def paper_recipe(c: ml_collections.ConfigDict, size: str, tokens: float = 20e9) -> ml_collections.ConfigDict:
  """The SPS paper's training recipe (docs/papers/sps.md#training): GPT-2 tokenizer, 4096 x 96
  tokens per step, AdamW (0.9, 0.95), wd 0.1, clip 1.0, peak 6e-4, warmup 50M tokens (XS, S) or
  100M (M, L, XL), constant, then linear decay over the last 2B tokens to 6e-5."""
  from nsl import config as nsl_config

  nsl_config.apply_size(c, size)
  c.model.vocab_size = 50304
  c.model.dtype = "auto"  # bfloat16 on TPU/GPU, float32 on CPU
  c.model.scan_layers = True  # XL compiles in a fraction of the unrolled time (docs/guide/pods.md#scanned-layers)
  # What fits where (docs/guide/pods.md#what-fits-where, `python -m nsl.hbm`): every chip on FSDP
  # (the batch of 96 divides over up to 32 chips), and full remat, without which the scanned XL
  # step needs 135 GiB a v5p chip.
  c.mesh.shape = (1, -1, 1)
  c.model.remat = "full"
  c.data.seq_len = 4096
  c.data.tokenizer = "gpt2"
  c.data.path = "data/fineweb-edu-gpt2"
  c.data.sources = ("hf:HuggingFaceFW/fineweb-edu:sample-10BT:train",)
  c.data.val_fraction = 0.001
  c.train.batch_size = 96
  tokens_per_step = c.data.seq_len * c.train.batch_size
  c.train.steps = int(round(tokens / tokens_per_step))
  warmup_tokens = 50e6 if size in ("xs", "s") else 100e6
  c.train.warmup_steps = int(round(warmup_tokens / tokens_per_step))
  c.train.decay_steps = int(round(2e9 / tokens_per_step))
  c.train.lr = 6e-4
  c.train.min_lr_ratio = 0.1
  c.train.log_every = 50
  c.train.eval_every = 2000
  c.train.eval_batches = 50
  c.checkpoint.every = 2000
  c.checkpoint.every_minutes = 10.0  # a spot slice's ~30 s notice: at most 10 minutes lost (pods.md)
  return c
