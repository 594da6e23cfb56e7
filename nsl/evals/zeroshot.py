"""Zero-shot task scores of a trained run: `python -m nsl.evals.zeroshot`.

  python -m nsl.evals.zeroshot --workdir=RUN --task=arc_easy=PATH.jsonl [--task=lambada=PATH ...]
                               [--limit=N] [--batch_size=16]

Tasks (arc_easy, hellaswag, piqa, sciq, lambada) are read and scored by
`nsl.evals.zeroshot_tasks.score_task`; this module supplies its `loglik(requests)` from the run's
model the way lm-evaluation-harness does:
  - tokens: the run's tokenizer (from its data manifest). A context's trailing spaces move to the
    continuation; continuation tokens = enc(context + continuation)[len(enc(context)):]; an empty
    context becomes [EOS];
  - rows: (context + continuation)[-(seq_len + 1):], so long contexts are cut from the left; the
    model sees row[:-1], right-padded to seq_len (padding is segment 0, which no real token
    attends to) and batched `--batch_size` rows at a time, longest first;
  - result: the summed log-probability of the continuation tokens and whether each one is the
    argmax (greedy).
The forward pass is the family's `token_logits(params, batch)` (`nsl.models.family.Family`: a
batch of seq_len + 1 tokens, next-token logits [B, T, V] aligned with its inputs; a LIFT run is
fed the states it uses at inference).
Scores merge into RUN/result.json under `zeroshot` (atomically) and print as one JSON object.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from nsl.errors import NslError, cli_main
from nsl.evals import zeroshot_tasks
from nsl.evals.nll import Parser, check_workdir, merge_result, mesh_of, run_data_dir


def encode_pair(tokenizer, context: str, continuation: str, eos_id: int) -> tuple[list[int], list[int]]:
  """lm-evaluation-harness `_encode_pair`: context and continuation token ids."""
  n_spaces = len(context) - len(context.rstrip())
  if n_spaces:
    context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
  if not context:
    return [eos_id], list(tokenizer.encode(continuation))
  whole = list(tokenizer.encode(context + continuation))
  context_ids = list(tokenizer.encode(context))
  return context_ids, whole[len(context_ids):]


def forward_fn(family):
  """(params, tokens [B, T+1], segment [B, T+1]) -> next-token logits [B, T, V]: `Family.token_logits`."""
  return lambda p, tok, seg: family.token_logits(p, {"tokens": tok, "segment": seg})


def make_scorer(family, config):
  """The jitted (params, tokens [B, T+1], segment [B, T+1]) -> (log-probability of each next
  token [B, T], whether it is the argmax [B, T]) that `make_loglik` batches requests through;
  built once, it scores any parameters of the family's shapes without compiling again."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from nsl import sharding

  seq_len, rules = int(config.data.seq_len), sharding.rules(config)
  forward = forward_fn(family)

  @jax.jit
  def score(p, tok_BT1, seg_BT1):
    with nn.logical_axis_rules(rules):
      logits = forward(p, tok_BT1, seg_BT1)
    if logits.ndim != 3 or logits.shape[:2] != (tok_BT1.shape[0], seq_len):
      raise NslError(f"family {config.family!r} returned logits of shape {logits.shape}; its "
                     "Family.token_logits(params, batch) must return [B, T, V]")
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    targets = tok_BT1[:, 1:]
    lp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return lp, jnp.argmax(logits, axis=-1) == targets

  return score


def make_loglik(family, params, config, tokenizer, eos_id: int, batch_size: int = 16, scorer=None):
  """The `loglik(requests) -> [(summed logprob, all greedy)]` callable of `score_task`
  (`scorer`: a `make_scorer` of this family to reuse; default a new one)."""
  from nsl import sharding

  seq_len, mesh = int(config.data.seq_len), mesh_of(params)
  score = scorer or make_scorer(family, config)
  if mesh is not None:  # rows must split evenly over the data-parallel devices
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    batch_size = -(-batch_size // dp) * dp

  def loglik(requests):
    pairs = [encode_pair(tokenizer, ctx, cont, eos_id) for ctx, cont in requests]
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    out: list = [None] * len(pairs)
    for start in range(0, len(order), batch_size):
      rows = order[start:start + batch_size]
      tok = np.full((batch_size, seq_len + 1), eos_id, np.int32)
      seg = np.zeros((batch_size, seq_len + 1), np.int32)
      lengths = []
      for r, i in enumerate(rows):
        ctx, cont = pairs[i]
        whole = (ctx + cont)[-(seq_len + 1):]
        tok[r, :len(whole)], seg[r, :len(whole)] = whole, 1
        lengths.append((len(whole) - 1, min(len(cont), len(whole) - 1)))
      if mesh is not None:
        with sharding.use_mesh(mesh):
          batch = sharding.global_batch({"tokens": tok, "segment": seg}, mesh)
          lp, greedy = score(params, batch["tokens"], batch["segment"])
      else:
        lp, greedy = score(params, tok, seg)
      lp, greedy = np.asarray(lp), np.asarray(greedy)
      for r, (i, (n_in, k)) in enumerate(zip(rows, lengths)):
        out[i] = (float(lp[r, n_in - k:n_in].sum()), bool(greedy[r, n_in - k:n_in].all()))
    return out

  return loglik


def score_tasks(loglik, tasks: list[tuple[str, str]], limit: int | None) -> dict[str, dict]:
  """{task: its `score_task` metrics, path and limit} of every (task, JSONL path) under `loglik`:
  this command's and the trainer's zeroshot evaluator's scores."""
  scores = {}
  for task, path in tasks:
    score = zeroshot_tasks.score_task(path, task, loglik, limit)
    score = {k: None if isinstance(v, float) and not np.isfinite(v) else v for k, v in score.items()}
    scores[task] = dict(score, path=os.path.abspath(path), limit=limit)  # NaN stderr (n = 1) -> null
  return scores


def _parse_task(spec: str) -> tuple[str, str]:
  task, sep, path = spec.partition("=")
  if not sep or not path:
    raise NslError(f"--task={spec!r}: expected TASK=PATH.jsonl with TASK one of {sorted(zeroshot_tasks.READERS)}")
  if task not in zeroshot_tasks.READERS:
    raise NslError(f"--task={spec!r}: unknown task {task!r}; known: {sorted(zeroshot_tasks.READERS)}")
  if not os.path.isfile(path):
    raise NslError(f"--task={spec!r}: no such task file {path}")
  return task, path


@cli_main
def main(argv: list[str] | None = None) -> int:
  p = Parser(prog="python -m nsl.evals.zeroshot", description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True, help="the run's directory")
  p.add_argument("--task", action="append", required=True,
                 help=f"TASK=PATH.jsonl, TASK one of {sorted(zeroshot_tasks.READERS)} (repeatable)")
  p.add_argument("--limit", type=int, default=None, help="first N examples of each file")
  p.add_argument("--batch_size", type=int, default=16, help="rows per forward pass")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  if args.limit is not None and args.limit < 1:
    raise NslError(f"--limit={args.limit}: must be >= 1")
  if args.batch_size < 1:
    raise NslError(f"--batch_size={args.batch_size}: must be >= 1")
  tasks = [_parse_task(t) for t in args.task]
  for task, path in tasks:  # malformed files fail before the model loads
    zeroshot_tasks.read_examples(path, task, args.limit)
  check_workdir(args.workdir)
  from nsl.data import prepare, tokenizers
  from nsl.evals.nll import _load_run

  config, family, params = _load_run(args.workdir)
  data_dir = run_data_dir(config)
  manifest = prepare.load_manifest(data_dir)
  tokenizer = tokenizers.load_tokenizer(manifest["tokenizer"], data_dir)
  loglik = make_loglik(family, params, config, tokenizer, int(manifest["eos_id"]), args.batch_size)
  scores = score_tasks(loglik, tasks, args.limit)
  merge_result(args.workdir, "zeroshot", scores)
  print(json.dumps({"zeroshot": scores}, sort_keys=True))
  return 0


if __name__ == "__main__":  # run the imported module, so its warnings are not attributed to __main__
  from nsl.evals.zeroshot import main as _main

  sys.exit(_main())
