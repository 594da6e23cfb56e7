"""NextLat and its GPT / MTP baselines (docs/papers/nextlat.md#definitions): `--config=configs/nextlat.py:NAME`.

Every NextLat config is the authors' model (their `models/model_nextlat.py`, held against nsl in
tools/xcheck/nextlat.py; docs/xcheck/nextlat.md): the dynamics model and losses of
nsl/models/nextlat.py at its defaults, on the authors' trunk (`authors_trunk`: output head untied
from the embedding, every matrix initialised N(0, 0.02) without GPT-2's residual scaling, their
SwiGLU width 128·round(8d/3/128)). The GPT and MTP baselines run the same trunk.

NAME (the leading `nextlat_` may be left off: `configs/nextlat.py:countdown` is `nextlat_countdown`):
  nextlat_tiny       the demo corpus (configs/tiny.py sizes), a d = 2 rollout, no prompt masking
  mtp_tiny           the MTP baseline there: d = 4 heads on the shared trunk
  nextlat_path_star  path-star G_{5,5} with the authors' recipe (`path_star_recipe`): 12L/6H/384d,
                     200k graphs, batch 512, LR 5e-4 constant, clip 100, 20k steps, d = ℓ − 2 = 3
                     (an accelerator run; configs/grids/path_star_cpu.py is its CPU-scale study)
  gpt_path_star      the GPT baseline: nextlat_path_star without the dynamics model
  mtp_path_star      the MTP baseline: d = ℓ − 2 heads instead
  nextlat_countdown  countdown at CPU scale
  gpt_countdown      the GPT baseline on countdown

  python -m nsl.launch --config=configs/nextlat.py:path_star --workdir=runs/nextlat_path_star
  python -m nsl.evals.planning --workdir=runs/nextlat_path_star

These replace configs/NAME.py; the old paths still resolve here (configs/aliases.py).
"""

import ml_collections

from configs import base, tiny
# The options' defaults (the authors' model) live there.
from nsl.models.latent_spec import authors_d_ff, authors_hidden, mtp_section, nextlat_section

ARGS = ("nextlat_tiny", "nextlat_countdown", "nextlat_path_star", "gpt_countdown", "gpt_path_star",
        "mtp_tiny", "mtp_path_star")
PATH_STAR_D, PATH_STAR_L = 5, 5
PATH_STAR_N_TRAIN, PATH_STAR_N_TEST = 200_000, 20_000  # the paper's fixed sets
COUNTDOWN_N_TRAIN, COUNTDOWN_N_TEST = 50_000, 1_000
# Their stargraph tokenizer: labels, '|', '=', '/', '$', EOS, and one more id (maxNodes + 6 with
# 100 labels); nsl's path-star tokens are labels and five specials (nsl/data/tasks/path_star.py).
PATH_STAR_VOCAB = 106


def authors_trunk(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The NextLat authors' trunk (their models/model_gpt.py Block under NextLatTransformer): an
  output head separate from the token embedding, every matrix N(0, init_std) (no GPT-2 residual
  scaling of the output projections), SwiGLU of width 128·round(8d/3/128). Call it after the
  width is set."""
  c.model.tie_embeddings = False
  c.model.scaled_out_init = False
  c.model.d_ff = authors_d_ff(c.model.d_model)
  return c


def path_star_data(c: ml_collections.ConfigDict, d: int = PATH_STAR_D, l: int = PATH_STAR_L,
                   n_train: int = PATH_STAR_N_TRAIN, n_test: int = PATH_STAR_N_TEST,
                   seed: int = 0) -> ml_collections.ConfigDict:
  """Data section for G_{d,ℓ} (nsl/data/tasks/path_star.py): one problem per window."""
  from nsl.data.tasks import path_star

  task = path_star.PathStar(d=d, l=l, n_train=n_train, n_test=n_test, seed=seed)
  c.data.sources = (f"task:path_star:d={d},l={l},n_train={n_train},n_test={n_test},seed={seed}",)
  c.data.path = f"data/path_star_d{d}_l{l}_n{n_train}_s{seed}"
  c.data.tokenizer = "byte"  # unused for task sources (the task writes its own token ids)
  c.data.seq_len = task.doc_len - 1
  c.data.answer_token = path_star.ANSWER
  c.model.vocab_size = PATH_STAR_VOCAB
  return c


def path_star_recipe(c: ml_collections.ConfigDict, steps: int = 20_000) -> ml_collections.ConfigDict:
  """The authors' path-star training (their paper's table and config): batch 512, AdamW
  (0.9, 0.95), LR 5e-4 constant from the first step (no warmup, no decay), weight decay 0.1 on
  every matrix (embedding and head included), gradient clipping at norm 100, 20k steps.
  Evaluation samples at temperature 1."""
  c.train.batch_size = 512
  c.train.steps = steps
  c.train.lr = 5e-4
  c.train.schedule = "wsd"
  c.train.warmup_steps = 0
  c.train.decay_steps = 0  # wsd with neither warmup nor decay: constant
  c.train.b1, c.train.b2 = 0.9, 0.95
  c.train.weight_decay = 0.1
  c.train.clip_norm = 100.0
  c.train.log_every = 50
  c.train.eval_every = 1000
  c.train.eval_batches = 4
  c.checkpoint.every = 1000
  return c


def path_star_model(c: ml_collections.ConfigDict, layers: int = 12, heads: int = 6,
                    width: int = 384) -> ml_collections.ConfigDict:
  """The paper's path-star model (12L/6H/384d) on the authors' trunk."""
  c.model.n_layers, c.model.n_heads, c.model.d_model = layers, heads, width
  return authors_trunk(c)


def countdown_data(c: ml_collections.ConfigDict, n_train: int = COUNTDOWN_N_TRAIN,
                   n_test: int = COUNTDOWN_N_TEST, seed: int = 0) -> ml_collections.ConfigDict:
  """Countdown at CPU scale (docs/papers/nextlat.md#hyperparameters: paper 12L/12H/768d, λ_h = 2, λ_KL = 1,
  MLP hidden 768, LR 3e-4, 500k problems; here 4L/4H/128d on 50k problems). 36-token documents, integer
  tokens (vocab 10_011 padded to 10_048), prompt (numbers, target, 8 pauses, '|') masked."""
  from nsl.data.tasks import countdown

  task = countdown.Countdown(n_train=n_train, n_test=n_test, seed=seed)
  c.data.sources = (f"task:countdown:n_train={n_train},n_test={n_test},seed={seed}",)
  c.data.path = f"data/countdown_n{n_train}_s{seed}"
  c.data.tokenizer = "byte"  # unused for task sources
  c.data.seq_len = task.doc_len - 1
  c.data.answer_token = countdown.ANSWER
  c.model.vocab_size = 10_048
  c.model.d_model = 128
  c.model.n_layers = 4
  c.model.n_heads = 4
  authors_trunk(c)
  c.train.batch_size = 64
  c.train.steps = 3000
  c.train.lr = 1e-3
  c.train.warmup_steps = 100
  c.train.decay_steps = 600
  c.train.log_every = 50
  c.train.eval_every = 1000
  c.train.eval_batches = 4
  c.checkpoint.every = 1000
  return c


def nextlat_tiny():
  c = authors_trunk(tiny.get_config())
  c.family = "nextlat"
  c.model.variant = "nextlat"
  c.nextlat = nextlat_section(hidden=2 * c.model.d_model)
  c.data.answer_token = -1  # plain text: no prompt masking
  return c


def mtp_tiny():
  c = authors_trunk(tiny.get_config())
  c.family = "mtp"
  c.model.variant = "mtp"
  c.mtp = mtp_section(horizon=4)
  c.data.answer_token = -1
  return c


def nextlat_path_star():
  c = path_star_recipe(path_star_model(path_star_data(base.get_config())))
  c.family = "nextlat"
  c.model.variant = "nextlat"
  # The paper's λ_h = 1, λ_KL = 1, MLP hidden 384 (proj_factor 0.5 at 384d), rollout d = ℓ - 2,
  # the final-normed latent. (nsl's earlier model, with the head tied to the embedding and L_KL
  # training only p_ψ, collapsed here with this latent at CPU scale and needed `latent="residual"`;
  # docs/xcheck/nextlat.md has what the authors' model does.)
  c.nextlat = nextlat_section(lambda_h=1.0, lambda_kl=1.0, horizon=PATH_STAR_L - 2,
                                    hidden=authors_hidden(c.model.d_model), draft_len=4)
  return c


def gpt_path_star():
  """Family nextlat, variant gpt: the same trunk, prompt masking, steps and data."""
  c = nextlat_path_star()
  c.model.variant = "gpt"
  return c


def mtp_path_star():
  c = nextlat_path_star()
  c.family = "mtp"
  c.model.variant = "mtp"
  c.mtp = mtp_section(horizon=PATH_STAR_L - 2)
  return c


def nextlat_countdown():
  c = countdown_data(base.get_config())
  c.family = "nextlat"
  c.model.variant = "nextlat"
  # The paper's λ_h = 2, λ_KL = 1, d = 1, MLP hidden 768 at 768d (proj_factor 0.5; 128 at this width).
  c.nextlat = nextlat_section(lambda_h=2.0, lambda_kl=1.0, horizon=1, hidden=authors_hidden(c.model.d_model),
                                    draft_len=4)
  return c


def gpt_countdown():
  c = nextlat_countdown()
  c.model.variant = "gpt"
  return c


def get_config(arg: str):
  return {"nextlat_tiny": nextlat_tiny, "nextlat_countdown": nextlat_countdown,
          "nextlat_path_star": nextlat_path_star, "gpt_countdown": gpt_countdown,
          "gpt_path_star": gpt_path_star, "mtp_tiny": mtp_tiny, "mtp_path_star": mtp_path_star}[arg]()
