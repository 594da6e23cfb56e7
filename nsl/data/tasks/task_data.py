"""Planning tasks (path-star, countdown) as nsl training data: fixed train / test sets.

A task data directory has the shard + manifest.json format of `nsl.data.prepare`, so the
trainer reads it unchanged, plus `task_test.npz` with the test problems for exact-match
evaluation (`nsl.evals.planning`):

  manifest.json        format_version 1; tokenizer {"name": "task:<task>", ...}; "task": parameters
  train_00000.bin      the training documents (one problem each, ending in EOS)
  val_00000.bin        the test documents (so `eval_val_nll` is the test-set loss)
  task_test.npz        prompts [N, P] int32 (left-padded with PAD), answers [N, A] int32

A *task source* is a string `task:<name>:k=v,k=v,...`, e.g.
`task:path_star:d=5,l=5,n_train=20000,n_test=1000,seed=0`. Configs name it in
`data.sources`; `nsl.data.prepare.ensure_prepared` hands such sources to `ensure_task_prepared`
so `python -m nsl.launch` generates the data on first use; `python -m nsl.data.tasks.path_star
--out=DIR ...` (or `.countdown`) writes it explicitly.

Every document of a task has the same length (prompts are left-padded with PAD), so with
`data.seq_len = doc_len - 1` each packed window is exactly one problem. Prompt tokens are
loss-masked by the families that read `data.answer_token` (nextlat, mtp): only targets after
that token within the same document count (`nsl.models.nextlat.answer_weights`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Sequence

import numpy as np

from nsl.errors import ConfigError, DataError, cli_main

PREFIX = "task:"
TEST_FILE = "task_test.npz"
TASKS = ("path_star", "countdown")
# Tasks with per-token labels and a held-out set, written by their own modules' `generate`
# (nsl/data/tasks/s5.py, arithmetic.py); `task:s5:seed=1,...` passes integer keyword arguments.
LABELLED_TASKS = ("s5", "arithmetic")


def is_task_source(sources: Sequence[str]) -> bool:
  """True for one source `task:<name>:...` of a generated task: the planning tasks (written
  here) or the labelled ones (S5, arithmetic: written by their own modules)."""
  return len(sources) == 1 and any(str(sources[0]).split(":")[:2] == ["task", t] for t in TASKS + LABELLED_TASKS)


def parse_source(spec: str) -> tuple[str, dict[str, int]]:
  """'task:path_star:d=5,l=5' -> ('path_star', {'d': 5, 'l': 5})."""
  parts = spec.split(":", 2)
  if len(parts) < 2 or parts[0] != "task" or parts[1] not in TASKS + LABELLED_TASKS:
    raise ConfigError(f"task source {spec!r} must look like task:<{'|'.join(TASKS + LABELLED_TASKS)}>:k=v,...")
  kwargs: dict[str, int] = {}
  if len(parts) == 3 and parts[2]:
    for item in parts[2].split(","):
      key, sep, value = item.partition("=")
      if not sep:
        raise ConfigError(f"task source {spec!r}: {item!r} is not k=v")
      try:
        kwargs[key.strip()] = int(value)
      except ValueError:
        raise ConfigError(f"task source {spec!r}: {key}={value!r} is not an integer") from None
  return parts[1], kwargs


def build(spec: str):
  """The task object (path_star.PathStar / countdown.Countdown) a source string describes."""
  import importlib

  name, kwargs = parse_source(spec)
  try:
    return importlib.import_module(f"nsl.data.tasks.{name}").from_kwargs(**kwargs)
  except TypeError as e:
    raise ConfigError(f"task source {spec!r}: {e}") from None


def _write_split(out_dir: str, split: str, docs: np.ndarray, dtype: np.dtype) -> dict:
  data = np.ascontiguousarray(docs.reshape(-1)).astype(dtype).tobytes()
  name = f"{split}_00000.bin"
  with open(os.path.join(out_dir, name), "wb") as f:
    f.write(data)
  shard = {"file": name, "tokens": int(docs.size), "bytes": len(data),
           "sha256": hashlib.sha256(data).hexdigest()}
  return {"documents": int(docs.shape[0]), "tokens": int(docs.size), "shards": [shard]}


def write_task(out_dir: str, spec: str, force: bool = False) -> dict:
  """Generates the task's train and test sets into `out_dir` (atomic, like prepare)."""
  from nsl.data.prepare import FORMAT_VERSION, MANIFEST, token_dtype

  task = build(spec)
  out_dir = os.path.abspath(out_dir)
  if os.path.exists(out_dir) and os.listdir(out_dir) and not force:
    raise DataError(f"{out_dir} already exists; remove it or pass --force")
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
  os.chmod(tmp, 0o755)
  t0 = time.time()
  try:
    train_docs, test_docs, prompts, answers = task.generate()
    dtype = token_dtype(task.vocab_size)
    splits = {"train": _write_split(tmp, "train", train_docs, dtype),
              "val": _write_split(tmp, "val", test_docs, dtype)}
    np.savez(os.path.join(tmp, TEST_FILE), prompts=prompts, answers=answers)
    manifest = {
        "format_version": FORMAT_VERSION, "sources": [spec], "max_docs": None, "seed": 0,
        "val_fraction": 0.0,  # the splits are the task's own fixed train and test sets
        "tokenizer": {"name": PREFIX + task.name, **task.tokenizer_spec()},
        "vocab_size": task.vocab_size, "eos_id": task.eos_id, "dtype": dtype.name,
        "shard_tokens": int(max(train_docs.size, test_docs.size)), "unigram_entropy_nats": None,
        "splits": splits, "task": {"name": task.name, **task.params(), "doc_len": task.doc_len,
                                   "answer_token": task.answer_token},
        "prepare_seconds": round(time.time() - t0, 3),
    }
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=1)
    if os.path.isfile(os.path.join(out_dir, MANIFEST)) and not force:
      return manifest  # another process finished the same deterministic data first
    if os.path.exists(out_dir):
      shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)
    return manifest
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def ensure_task_prepared(out_dir: str, sources: Sequence[str]) -> dict:
  """The manifest of a task data dir, generating it first when missing; DataError when it holds
  another task than `sources` names."""
  from nsl.data.prepare import MANIFEST, load_manifest

  name, kwargs = parse_source(sources[0])
  if name in LABELLED_TASKS:
    return _ensure_labelled(out_dir, name, kwargs)
  if os.path.isfile(os.path.join(out_dir, MANIFEST)):
    manifest = load_manifest(out_dir)
    if manifest.get("sources") != list(sources):
      raise DataError(f"data dir {out_dir} holds {manifest.get('sources')}, not {list(sources)}; "
                      "use another data.path or delete it")
    return manifest
  return write_task(out_dir, sources[0])


def _ensure_labelled(out_dir: str, name: str, kwargs: dict[str, int]) -> dict:
  """S5 / arithmetic: reuse `out_dir` when it holds that task, else generate it (defaults plus
  the source's k=v; the same as `python -m nsl.data.tasks.<name> --out=DIR`)."""
  import importlib

  from nsl.data.prepare import MANIFEST, load_manifest

  if os.path.isfile(os.path.join(out_dir, MANIFEST)):
    manifest = load_manifest(out_dir)
    if manifest.get("task", {}).get("name") != name:
      raise DataError(f"data dir {out_dir} does not hold the {name} task; use another data.path or delete it")
    return manifest
  module = importlib.import_module(f"nsl.data.tasks.{name}")
  print(f"nsl: generating the {name} task into {out_dir} (python -m nsl.data.tasks.{name})", file=sys.stderr)
  try:
    return module.generate(out_dir, **kwargs)
  except TypeError as e:
    raise ConfigError(f"task source task:{name}: {e}") from None


def load_test(data_dir: str) -> tuple[np.ndarray, np.ndarray]:
  """(prompts [N, P], answers [N, A]) of a task data dir's test set."""
  path = os.path.join(data_dir, TEST_FILE)
  if not os.path.isfile(path):
    raise DataError(f"{path} is missing; {data_dir} is not a planning-task data dir "
                    "(write one with python -m nsl.data.tasks.path_star --out=DIR)")
  with np.load(path) as z:
    return z["prompts"], z["answers"]


def task_of(data_dir: str):
  """The task object a task data dir was generated from."""
  from nsl.data.prepare import load_manifest

  return build(load_manifest(data_dir)["sources"][0])


@cli_main
def write_main(spec: str, out: str, force: bool) -> int:
  m = write_task(out, spec, force=force)
  print(json.dumps({"out": out, **m["task"], "vocab_size": m["vocab_size"],
                    "train_documents": m["splits"]["train"]["documents"],
                    "test_documents": m["splits"]["val"]["documents"],
                    "seconds": m["prepare_seconds"]}))
  return 0
