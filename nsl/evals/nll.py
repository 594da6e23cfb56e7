"""Mean NLL per token of a trained run on held-out token sets: `python -m nsl.evals.nll`.

  python -m nsl.evals.nll --workdir=RUN [--data=DIR | --data=NAME=DIR ...] [--split=val]
                          [--max_batches=N] [--batch_size=B] [--view=NAME]

Without --data: the run's own data (where the run read it, else config `data.path` from the current
directory), recorded as eval["val"] (eval["<split>"] for another split).
Each --data is another directory prepared with `nsl.data.prepare`, e.g. an out-of-distribution
corpus, recorded as eval["NAME"] (default NAME: the directory's basename; "NAME_<split>" for a
split other than val). It must use the run's tokenizer (its own copy in WORKDIR/tokenizer,
`nsl.data.rundata`, else its data dir's): the same spec and the same tokenizer file, or DataError —
NLLs under different tokenizers are not comparable.

The batches are the trainer's evaluation batches (`pipeline.make_eval_batches`: consecutive
windows of seq_len + 1 tokens, no shuffle, default batch = train.batch_size / grad_accum) and the
NLL is summed over the weighted targets of the family's own loss and divided by their count, so
`--max_batches=<train.eval_batches>` reproduces the trainer's final eval. Default: the whole split.
Results merge into RUN/result.json (`eval`, and `eval_details` with what was measured how),
written atomically, and print as one JSON object. For text data, each set also gets bits per byte
(`eval_bits_per_byte[KEY]`, and in `eval_details[KEY]`: bits_per_byte, bytes_per_token and the
UTF-8 bytes and scored targets they were measured on; `nsl.data.bytes_per_token`), so runs with
different tokenizers compare.

`--view=NAME` (also `--feed`) scores one of the family's named logits views (`Family.views`,
`view_logits`; default its first, the one it generates with), recorded under the key plus the
view's suffix (`Family.view_suffix`). Most families have the one view `own`, their plain forward.
A LIFT run's views are the states fed: `own` (default, the paper's metric) feeds back the model's
own states token by token with its KV cache, document by document, as at inference
(lift_no_states: b, the states it is used with; distill has no channel); `teacher` feeds the
teacher's states in parallel (the training phase); `bias` feeds b everywhere; `own` is recorded
under the plain key (eval["val"], the trainer's eval_val_nll), the others as
eval["val_feed_teacher"], eval["val_feed_bias"].
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from nsl.errors import ArgumentParser, ConfigError, DataError, NslError, cli_main
from nsl.evals import common, kinds


Parser = ArgumentParser  # argparse whose mistakes are one line and exit status 2 (nsl.errors)


def check_workdir(workdir: str) -> dict:
  """The run's config.json as a dict; NslError naming what is missing."""
  from nsl import storage  # a local run directory or gs://bucket/run

  storage.check_bucket(workdir, "--workdir")
  if not storage.isdir(workdir):
    raise NslError(f"--workdir={workdir}: no such run directory")
  path = storage.join(workdir, "config.json")
  if not storage.isfile(path):
    raise NslError(f"--workdir={workdir}: no config.json (not a run directory, or the run never started)")
  if not storage.isdir(storage.join(workdir, "checkpoints")):
    raise NslError(f"--workdir={workdir}: no checkpoints directory; train the run first")
  try:
    return json.loads(storage.read_text(path))
  except json.JSONDecodeError as e:
    raise NslError(f"{path}: malformed JSON at line {e.lineno}: {e.msg}") from None


def _load_run(workdir: str):
  """(config, family, params) of a trained run: its config.json and the parameters of its latest
  checkpoint, sharded as in training on a mesh of this host's devices (the config's mesh, or
  all devices data-parallel when that mesh does not fit here).

  Unlike `nsl.runs.load_run` (first device only), the parameters keep the training
  shardings, because the trainer's eval step runs here on the mesh.
  """
  import flax.linen as nn
  import jax
  import ml_collections

  from nsl import checkpoint, sharding
  from nsl.models import registry
  from nsl.train import state as train_state

  config = ml_collections.ConfigDict(check_workdir(workdir))
  family = registry.get_family(config)
  try:
    mesh = sharding.make_mesh(config)
  except ConfigError:
    config.mesh.shape = [-1, 1, 1]
    mesh = sharding.make_mesh(config)
  optimizer = train_state.make_optimizer(config)
  boxed = jax.eval_shape(lambda r: train_state.create(family.init(r), optimizer), jax.random.PRNGKey(0))
  with nn.logical_axis_rules(sharding.rules(config)):
    shardings = sharding.logical_sharding(boxed, mesh, config)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), nn.unbox(boxed),
                          shardings)
  params, _ = checkpoint.restore_params(workdir, abstract, flag="--workdir")
  return config, family, params


def mesh_of(params):
  """The mesh the parameters live on (None when they are not on a named mesh)."""
  import jax

  sh = getattr(jax.tree.leaves(params)[0], "sharding", None)
  return getattr(sh, "mesh", None)


def run_data_dir(config, workdir: str | None = None) -> str:
  """The local directory of the run's own data (`nsl.data.rundata.data_dir`: where the run read it,
  else config data.path from here); DataError naming it when it is not here."""
  from nsl.data import rundata

  return rundata.data_dir(workdir, config)


def tokenizer_of(directory: str) -> dict:
  """What carries a tokenizer spec: a data dir's manifest, or a run's own tokenizer dir's data.json
  (`nsl.data.rundata`); both have `tokenizer`, `vocab_size` and `eos_id`."""
  from nsl.data import datadir, rundata

  if not os.path.isfile(os.path.join(directory, datadir.MANIFEST)) and os.path.isfile(
      os.path.join(directory, rundata.INFO)):
    return rundata.read_info(directory)
  return datadir.load_manifest(directory)


def make_step(family, config, view: str | None = None):
  """The jitted (params, batch) -> (summed NLL, scored targets) of `family` (`view`: one of
  `family.views()`, scored with `family.view_logits`; None = the trainer's eval step)."""
  import flax.linen as nn
  import jax

  from nsl import sharding
  from nsl.train import step as train_step_lib

  rules = sharding.rules(config)
  if view is not None:
    def step_fn(p, b):
      nll, w = common.token_nll(family, p, b, view=view)
      return nll.sum(), w.sum()
  else:
    step_fn = train_step_lib.make_eval_step(family)

  def with_rules(*args):
    with nn.logical_axis_rules(rules):
      return step_fn(*args)

  return jax.jit(with_rules)


def summed_nll(step_fn, params, batches, mesh) -> tuple[float, float]:
  """(summed NLL, scored targets) of `step_fn` over `batches` (each process's rows, assembled on
  `mesh`; None = the arrays as they are): the one loop of the trainer's eval and this command."""
  from nsl import sharding

  total = count = 0.0
  with (sharding.use_mesh(mesh) if mesh is not None else contextlib.nullcontext()):
    for batch in batches:
      batch = sharding.global_batch(batch, mesh) if mesh is not None else batch
      s, w = step_fn(params, batch)
      total += float(s)
      count += float(w)
  return total, count


def evaluate(family, params, config, data_dir: str, split: str, batch_size: int,
             max_batches: int | None, view: str | None = None, step_fn=None, process_index: int = 0,
             process_count: int = 1) -> dict:
  """{"nll", "tokens", "batches"}: mean NLL per target over the split's evaluation batches, with
  `step_fn` (default `make_step(family, config, view)`); `process_index/count`: this process's
  rows of each global batch (the trainer's evaluators on several hosts)."""
  from nsl.data import pipeline

  batches = pipeline.make_eval_batches(data_dir, split, seq_len=int(config.data.seq_len), batch_size=batch_size,
                                       max_batches=max_batches, process_index=process_index,
                                       process_count=process_count)
  total, count = summed_nll(step_fn or make_step(family, config, view), params, batches, mesh_of(params))
  if count == 0:
    raise DataError(f"{split} split of {data_dir}: no scored tokens in {len(batches)} batches")
  return {"nll": total / count, "tokens": int(count), "batches": len(batches)}


def check_data(config, path: str, own_dir: str, flag: str = "--data") -> dict:
  """The manifest of data dir `path`; DataError unless it was tokenized like the run's `own_dir`
  (its data dir or its own tokenizer dir, `tokenizer_of`: the same tokenizer spec and file, since
  NLLs under different tokenizers are not comparable) and its ids fit the model's vocabulary."""
  from nsl.data.datadir import load_manifest, tokenizer_fingerprint

  manifest, own = load_manifest(path), tokenizer_of(own_dir)
  if tokenizer_fingerprint(path, manifest) != tokenizer_fingerprint(own_dir, own):
    raise DataError(f"{flag}={path}: tokenized with {manifest['tokenizer']}, but the run used "
                    f"{own['tokenizer']} from {own_dir}; prepare it with the run's tokenizer")
  if manifest["vocab_size"] > int(config.model.vocab_size):
    raise DataError(f"{flag}={path}: {manifest['vocab_size']} token ids exceed the model's vocabulary "
                    f"{config.model.vocab_size}")
  return manifest


def merge_result(workdir: str, key: str, values: dict, details: dict | None = None) -> dict:
  """Merges `values` into result.json[key] (and `details` into result.json["eval_details"])."""
  from nsl.metrics import write_json

  from nsl import storage

  path = storage.join(workdir, "result.json")  # a local run or a gs:// one
  result = {}
  if storage.isfile(path):
    try:
      result = json.loads(storage.read_text(path))
    except json.JSONDecodeError as e:
      raise NslError(f"{path}: malformed JSON at line {e.lineno}: {e.msg}") from None
  result.setdefault(key, {}).update(values)
  if details:
    result.setdefault("eval_details", {}).update(details)
  write_json(path, result)
  return result


def _parse_data(spec: str) -> tuple[str, str]:
  name, sep, path = spec.partition("=")
  if not sep:
    path, name = spec, os.path.basename(os.path.normpath(spec))
  if not name or not path:
    raise NslError(f"--data={spec!r}: expected DIR or NAME=DIR")
  return name, path


@cli_main
def main(argv: list[str] | None = None) -> int:
  p = common.run_parser("nll", __doc__)
  p.add_argument("--data", action="append", default=[], help="DIR or NAME=DIR prepared with nsl.data.prepare "
                 "(repeatable; default: the run's own data)")
  kinds.add_flags(p, kinds.Nll)  # --split, --max_batches: the fields of config.evals' nll kind
  p.add_argument("--batch_size", type=int, default=None, help="sequences per batch (default: the run's)")
  p.add_argument("--view", "--feed", dest="view", default=None,
                 help="a named view of the run's logits (the family's views; LIFT: own, teacher, bias, the states "
                      "fed; default its first, own: LIFT's states fed back token by token, the paper's metric)")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  kinds.check_flags(args, kinds.Nll)
  sets = [_parse_data(d) for d in args.data]
  import ml_collections

  from nsl.data import datadir, rundata

  config = ml_collections.ConfigDict(check_workdir(args.workdir))
  sets = [(name, datadir.fetch(path)) for name, path in sets]  # gs:// dirs: their local copies
  for _, path in sets:
    datadir.load_manifest(path)  # a missing or broken data dir fails before the model loads
  if not sets:  # the run's own data; its tokenizer is the run's own copy when it has one
    sets = [(args.split, run_data_dir(config, args.workdir))]
  own_dir = rundata.local_dir(args.workdir) or run_data_dir(config, args.workdir)
  config, family, params = _load_run(args.workdir)
  view = family.view(args.view, "--view")
  multi = len(family.views()) > 1  # the trainer's eval step reads a one-view family: same numbers, one program
  batch_size = args.batch_size or int(config.train.batch_size) // int(config.train.grad_accum)
  from nsl.data import bytes_per_token

  values, details, bits = {}, {}, {}
  for name, path in sets:
    check_data(config, path, own_dir)
    key = name if not args.data or args.split == "val" else f"{name}_{args.split}"
    key += family.view_suffix(view)
    r = evaluate(family, params, config, path, args.split, batch_size, args.max_batches, view if multi else None)
    values[key] = r["nll"]
    details[key] = {"data": os.path.abspath(path), "split": args.split, "tokens": r["tokens"],
                    "batches": r["batches"], "batch_size": batch_size, "seq_len": int(config.data.seq_len)}
    if multi:
      details[key]["view"] = view
    details[key].update(bytes_per_token.eval_fields(path, args.split, r["nll"]))
    if "bits_per_byte" in details[key]:
      bits[key] = details[key]["bits_per_byte"]
  merge_result(args.workdir, "eval", values, details)
  if bits:  # beside the trainer's own eval_bits_per_byte (nsl.data.bytes_per_token.record_fields)
    merge_result(args.workdir, "eval_bits_per_byte", bits)
  print(json.dumps({"eval": values, "eval_bits_per_byte": bits, "eval_details": details}, sort_keys=True))
  return 0


if __name__ == "__main__":  # run the imported module, so its warnings are not attributed to __main__
  from nsl.evals.nll import main as _main

  sys.exit(_main())
