"""Frozen LIFT teachers (docs/papers/lift.md#teacher): any nsl run with the same tokenizer.

On the fly: `config.lift.teacher = RUN_DIR`; `Teacher.load` restores the run's latest parameters
(frozen: they are constants of the student's step, never in its optimizer) and
`LiftFamily.teacher_states` turns its teacher-forced inference logits (`Teacher.logits`) into
top-k τ states: for a standard teacher one parallel forward; for a LIFT-family teacher (LIFT or
LIFT-RNN, the usual S5 teacher) its own states fed back sequentially with its KV cache, document
by document, exactly what that run produces at inference.

Precomputed (reused across runs):

  python -m nsl.models.teacher precompute --teacher=RUN --data=DIR --out=DIR [--seq_len=N]
      [--top_k=1024] [--temperature=1.5] [--batch_size=16]

writes a data dir whose manifest points at DIR's token shards (absolute paths; only DIR's
tokenizer file is copied, so `nsl.evals.nll` sees DIR's tokenizer there) and adds, per split,
`extra_shards` `teacher_idx` (uint16/uint32 [tokens, k]) and `teacher_val` (float16 [tokens, k],
the top-k τ-softmax probabilities). State row i is the teacher's
prediction after token i *within its training window* of seq_len + 1 tokens (the windows of
nsl.data.pipeline), so the student must use the same `data.seq_len`; the last token of each
window (never an input) and the tail have zero rows. Train the student with
`--config.data.path=OUT --config.lift.teacher=precomputed`; the pipeline then adds
`teacher_idx` / `teacher_val` [B, seq_len + 1, k] to each batch.

The tokenizer check compares the tokenizer spec (and the hash of its file for BPE / GPT-2) of
the teacher's and the student's data dirs; when the teacher's data dir is not present, the
config's tokenizer fields and vocabulary size.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

from nsl.errors import ArgumentParser, ConfigError, DataError, NslError, cli_main
from nsl import runs


def _read_config(workdir: str):
  import ml_collections

  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise NslError(f"teacher {workdir!r}: no config.json (not an nsl run directory)")
  if not os.path.isdir(os.path.join(workdir, "checkpoints")):
    raise NslError(f"teacher {workdir!r}: no checkpoints directory; train the teacher first")
  from nsl import options

  with open(path) as f:
    return options.upgrade(ml_collections.ConfigDict(json.load(f)))


def load_run(workdir: str):
  """(config, family, params) of a trained run: `nsl.runs.load_run`."""

  return runs.load_run(workdir, flag="config.lift.teacher")


def tokenizer_fingerprint(config) -> str:
  """The tokenizer identity of a config: its data dir's tokenizer spec + file hash, or the config fields."""
  path = str(config.data.path)
  manifest_path = os.path.join(path, "manifest.json")
  if os.path.isfile(manifest_path):
    with open(manifest_path) as f:
      spec = json.load(f)["tokenizer"]
    digest = ""
    fname = spec.get("file") or {"gpt2": "gpt2.tiktoken"}.get(spec.get("name"))
    if fname and os.path.isfile(os.path.join(path, fname)):
      with open(os.path.join(path, fname), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return json.dumps(spec, sort_keys=True) + digest
  d = config.data
  return json.dumps({"name": d.tokenizer, "requested_vocab_size": d.tokenizer_vocab if d.tokenizer == "bpe" else None})


def check_same_tokenizer(teacher_config, student_config, teacher_dir: str) -> None:
  t, s = tokenizer_fingerprint(teacher_config), tokenizer_fingerprint(student_config)
  # Compare like with like when only one side has its data dir here.
  t_has = os.path.isfile(os.path.join(str(teacher_config.data.path), "manifest.json"))
  s_has = os.path.isfile(os.path.join(str(student_config.data.path), "manifest.json"))
  if t_has != s_has:
    f = lambda c: (str(c.data.tokenizer), int(c.data.tokenizer_vocab) if c.data.tokenizer == "bpe" else None)
    same = f(teacher_config) == f(student_config)
  else:
    same = t == s
  if not same:
    raise ConfigError(f"config.lift.teacher={teacher_dir!r} was trained with another tokenizer "
                      f"(teacher data {teacher_config.data.path!r}, tokenizer {teacher_config.data.tokenizer!r}; "
                      f"this run: {student_config.data.path!r}, {student_config.data.tokenizer!r}); "
                      "a LIFT teacher must share the student's tokenizer")
  if int(teacher_config.model.vocab_size) > int(student_config.model.vocab_size):
    raise ConfigError(f"teacher vocab_size {teacher_config.model.vocab_size} > student config.model.vocab_size="
                      f"{student_config.model.vocab_size}; raise the student's vocab_size")


class Teacher:
  """A frozen nsl model: `logits(batch)` = the next-token logits [B, T, V_teacher] the run
  produces at inference, teacher-forced on the batch's tokens (packed rows document by document).

  For most families that is one parallel forward. A LIFT-family teacher (lift, lift_rnn) feeds
  back its own states token by token with its KV cache, the initial state at every document
  start (`LiftFamily.token_logits(feed='own')`): T sequential steps per row, so for long text
  windows precompute the states once. lift_no_states is fed b (its inference), distill has no
  channel. On-the-fly teachers and `precompute` both go through this method."""

  def __init__(self, config, family, params, workdir: str = ""):
    self.config, self.family, self.params, self.workdir = config, family, params, workdir

  @staticmethod
  def load(workdir: str, student_config=None) -> "Teacher":
    teacher_config = _read_config(workdir)
    if student_config is not None:
      check_same_tokenizer(teacher_config, student_config, workdir)
    config, family, params = load_run(workdir)
    return Teacher(config, family, params, workdir)

  def logits(self, batch, params=None):
    import jax
    import jax.numpy as jnp

    p = self.params if params is None else params
    plain = {k: batch[k] for k in ("tokens", "segment") if k in batch}
    out = self.family.token_logits(p, plain)  # `Family.token_logits`: LIFT feeds its own states
    return jax.lax.stop_gradient(jnp.asarray(out, jnp.float32))


# -- precompute ---------------------------------------------------------------------------------
def precompute(teacher_dir: str, data_dir: str, out_dir: str, seq_len: int | None = None, top_k: int = 1024,
               temperature: float = 1.5, batch_size: int = 16, splits=("train", "val"), force: bool = False) -> dict:
  """Writes the precomputed-states data dir (module docstring); returns its manifest."""
  import jax
  import jax.numpy as jnp

  from nsl.data import datadir, pipeline

  teacher = Teacher.load(teacher_dir)
  student_like = teacher.config.copy_and_resolve_references()
  student_like.data.path = data_dir
  check_same_tokenizer(teacher.config, student_like, teacher_dir)
  seq_len = int(seq_len or teacher.config.data.seq_len)
  if top_k <= 0 or temperature <= 0:
    raise ConfigError("--top_k and --temperature must be positive")
  manifest = datadir.load_manifest(data_dir)
  vocab = int(teacher.config.model.vocab_size)
  k = min(top_k, vocab)
  idx_dtype = datadir.token_dtype(vocab)

  @jax.jit
  def states(params, tokens, segment):
    logits = teacher.logits({"tokens": tokens, "segment": segment}, params)
    vals, idx = jax.lax.top_k(logits, k)
    return idx, jax.nn.softmax(vals / temperature, axis=-1)

  out_dir = os.path.abspath(out_dir)
  if os.path.exists(os.path.join(out_dir, datadir.MANIFEST)) and not force:
    raise DataError(f"{out_dir} is already prepared; pass --force to rebuild it")
  new = json.loads(json.dumps(manifest))
  with datadir.Staging(out_dir) as st:  # the data-dir writer: temp dir, checked, renamed into place
    for split in splits:
      if split not in manifest["splits"]:
        continue
      entry = new["splits"][split]
      for key in ("shards", "label_shards"):
        for s in entry.get(key, []):
          s["file"] = os.path.abspath(os.path.join(data_dir, s["file"]))
      tokens = pipeline.SplitTokens(data_dir, manifest, split)
      n_tok = tokens.num_tokens
      window = seq_len + 1
      idx_all = np.zeros((n_tok, k), idx_dtype)
      val_all = np.zeros((n_tok, k), np.float16)
      n_win = n_tok // window
      for w0 in range(0, n_win, batch_size):
        ws = list(range(w0, min(n_win, w0 + batch_size)))
        toks = np.stack([tokens.read(w * window, window) for w in ws])
        seg = pipeline.segment_ids(toks, manifest["eos_id"])
        idx, val = jax.device_get(states(teacher.params, jnp.asarray(toks), jnp.asarray(seg)))
        for j, w in enumerate(ws):
          idx_all[w * window:w * window + seq_len] = idx[j]
          val_all[w * window:w * window + seq_len] = val[j]
      extra = {}
      for name, arr in (("teacher_idx", idx_all), ("teacher_val", val_all)):
        shard = datadir.write_shard(st.path, f"{split}_{name}_00000.bin", arr)
        extra[name] = {"width": k, "dtype": arr.dtype.name, "shards": [{**shard, "tokens": n_tok}]}  # tokens = rows
      entry["extra_shards"] = extra
    new["splits"] = {s: new["splits"][s] for s in splits if s in new["splits"]}
    new["teacher"] = {"run": os.path.abspath(teacher_dir), "top_k": k, "temperature": temperature,
                      "seq_len": seq_len, "source_data": os.path.abspath(data_dir)}
    datadir.copy_tokenizer(data_dir, manifest, st.path)  # so OUT's tokenizer fingerprint is DIR's
    return st.install(new, force)


def main(argv=None) -> int:
  p = ArgumentParser(prog="python -m nsl.models.teacher", description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="command", required=True)
  pre = sub.add_parser("precompute", help="teacher states -> top-k shards beside a data dir")
  pre.add_argument("--teacher", required=True, help="the teacher's run directory (any nsl run, same tokenizer)")
  pre.add_argument("--data", required=True, help="the data directory whose rows get states")
  pre.add_argument("--out", required=True, help="the data directory to write: --data's rows with the teacher's states")
  pre.add_argument("--seq_len", type=int, default=0, help="window length of the student (default: the teacher's)")
  pre.add_argument("--top_k", type=int, default=1024, help="states keep the teacher's top k probabilities")
  pre.add_argument("--temperature", type=float, default=1.5, help="softmax temperature of the states")
  pre.add_argument("--batch_size", type=int, default=16, help="rows per teacher forward pass")
  pre.add_argument("--force", action="store_true", help="rewrite an existing --out")
  a = p.parse_args(argv)
  m = precompute(a.teacher, a.data, a.out, a.seq_len or None, a.top_k, a.temperature, a.batch_size, force=a.force)
  print(f"teacher: wrote {a.out} (k={m['teacher']['top_k']}, seq_len={m['teacher']['seq_len']})", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(cli_main(main)())
