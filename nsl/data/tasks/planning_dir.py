"""The data dir of a planning task (path-star, countdown): its fixed train / test sets.

The shard + manifest format of `nsl.data.datadir` (so the trainer reads it unchanged), plus
`task_test.npz` with the test problems for exact-match evaluation (`nsl.evals.planning`):

  manifest.json        format_version 1; tokenizer {"name": "task:<task>", ...}; "task": parameters
  train_00000.bin      the training documents (one problem each, ending in EOS)
  val_00000.bin        the test documents (so `eval_val_nll` is the test-set loss)
  task_test.npz        prompts [N, P] int32 (left-padded with PAD), answers [N, A] int32

A task is a `PlanningTask`; this module never imports the task modules, so their CLIs
(`python -m nsl.data.tasks.path_star --out=DIR`) write through it without an import circle;
`nsl.data.tasks.task_data` builds the task from a source string first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import ClassVar

import numpy as np

from nsl.data import datadir
from nsl.errors import ArgumentParser, DataError, cli_main

PREFIX = "task:"
TEST_FILE = "task_test.npz"


@dataclasses.dataclass(frozen=True)
class PlanningTask:
  """What `write` and the planning evaluator (`nsl.evals.planning`) read of a task: a frozen
  dataclass whose fields are its integer parameters (`params()`, recorded in the manifest), and
  its identity, given as class keywords:
  `class PathStar(PlanningTask, name="path_star", vocab_size=105, eos_id=103, answer_token=102)`.
  Subclasses add the fields, the layout (`prompt_len`, `doc_len`, `tokenizer_spec`) and the
  problems (`generate`, `is_correct`)."""

  name: ClassVar[str]
  vocab_size: ClassVar[int]
  eos_id: ClassVar[int]
  answer_token: ClassVar[int]  # the marker ending the loss-masked prompt (`data.answer_token`)

  def __init_subclass__(cls, *, name: str, vocab_size: int, eos_id: int, answer_token: int, **kwargs):
    super().__init_subclass__(**kwargs)
    cls.name, cls.vocab_size, cls.eos_id, cls.answer_token = name, vocab_size, eos_id, answer_token

  def params(self) -> dict:
    return dataclasses.asdict(self)


def _split(directory: str, split: str, docs: np.ndarray, dtype: np.dtype) -> dict:
  shard = datadir.write_shard(directory, f"{split}_00000.bin", docs.reshape(-1).astype(dtype))
  return {"documents": int(docs.shape[0]), "tokens": int(docs.size), "shards": [shard]}


def write(out_dir: str, spec: str, task, force: bool = False) -> dict:
  """Generates `task` (described by the source string `spec`) into `out_dir`; its manifest."""
  out_dir = os.path.abspath(out_dir)
  if os.path.exists(out_dir) and os.listdir(out_dir) and not force:
    raise DataError(f"{out_dir} already exists; remove it or pass --force")
  t0 = time.time()
  with datadir.Staging(out_dir) as st:
    train_docs, test_docs, prompts, answers = task.generate()
    dtype = datadir.token_dtype(task.vocab_size)
    splits = {"train": _split(st.path, "train", train_docs, dtype), "val": _split(st.path, "val", test_docs, dtype)}
    np.savez(os.path.join(st.path, TEST_FILE), prompts=prompts, answers=answers)
    manifest = {
        "format_version": datadir.FORMAT_VERSION, "sources": [spec], "max_docs": None, "seed": 0,
        "val_fraction": 0.0,  # the splits are the task's own fixed train and test sets
        "tokenizer": {"name": PREFIX + task.name, **task.tokenizer_spec()},
        "vocab_size": task.vocab_size, "eos_id": task.eos_id, "dtype": dtype.name,
        "shard_tokens": int(max(train_docs.size, test_docs.size)), "unigram_entropy_nats": None,
        "splits": splits, "task": {"name": task.name, **task.params(), "doc_len": task.doc_len,
                                   "answer_token": task.answer_token},
        "prepare_seconds": round(time.time() - t0, 3),
    }
    if os.path.isfile(os.path.join(out_dir, datadir.MANIFEST)) and not force:
      return manifest  # another process finished the same deterministic data first
    return st.install(manifest, force=True)  # out_dir is empty, absent, or ours to replace (force)


def load_test(data_dir: str) -> tuple[np.ndarray, np.ndarray]:
  """(prompts [N, P], answers [N, A]) of a task data dir's test set."""
  path = os.path.join(data_dir, TEST_FILE)
  if not os.path.isfile(path):
    raise DataError(f"{path} is missing; {data_dir} is not a planning-task data dir "
                    "(write one with python -m nsl.data.tasks.path_star --out=DIR)")
  with np.load(path) as z:
    return z["prompts"], z["answers"]


PARAM_HELP = {"n_train": "training problems to generate", "n_test": "test problems to generate",
              "max_num": "largest number in a problem", "d": "number of arms",
              "l": "arm length ℓ: nodes per arm plus the centre",
              "seed": "random seed of the problems"}


def task_main(name: str, task_cls, defaults: dict[str, int], argv=None) -> int:
  """`python -m nsl.data.tasks.NAME --out=DIR [--PARAM=N ...]`: one integer flag per task parameter
  (`defaults`, in the order of the task's source string `task:NAME:k=v,...`)."""
  p = ArgumentParser(prog=f"python -m nsl.data.tasks.{name}")  # described by the task module's docstring
  for key, value in defaults.items():
    p.add_argument(f"--{key}", type=int, default=value, help=PARAM_HELP.get(key))
  p.add_argument("--out", required=True, help="the task data dir to write (train/val shards and the test set)")
  p.add_argument("--force", action="store_true", help="rewrite an existing data dir")
  a = p.parse_args(argv)
  params = {key: getattr(a, key) for key in defaults}
  spec = f"task:{name}:" + ",".join(f"{k}={v}" for k, v in params.items())
  return write_main(spec, lambda: task_cls(**params), a.out, a.force)


@cli_main
def write_main(spec: str, make_task, out: str, force: bool) -> int:
  """The task CLIs' body: `make_task()` (a bad parameter is one line, exit 2) written to `out`."""
  m = write(out, spec, make_task(), force=force)
  print(json.dumps({"out": out, **m["task"], "vocab_size": m["vocab_size"],
                    "train_documents": m["splits"]["train"]["documents"],
                    "test_documents": m["splits"]["val"]["documents"],
                    "seconds": m["prepare_seconds"]}))
  return 0
