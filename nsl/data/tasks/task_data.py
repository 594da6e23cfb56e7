"""Generated-task sources (`task:<name>:k=v,...`) -> task data dirs, written on first use.

A *task source* is a string `task:<name>:k=v,k=v,...`, e.g.
`task:path_star:d=5,l=5,n_train=20000,n_test=1000,seed=0`. Configs name it in
`data.sources`; `nsl.data.prepare.ensure_prepared` hands such sources to `ensure_task_prepared`
so `python -m nsl.launch` generates the data on first use; `python -m nsl.data.tasks.path_star
--out=DIR ...` (or `.countdown`) writes it explicitly. The planning tasks' dirs (train / test
sets plus `task_test.npz`) are written by `nsl.data.tasks.planning_dir`, the labelled tasks'
(S5, arithmetic) by their own modules' `generate` (`nsl.data.datadir.write_labelled_dir`).

Every document of a planning task has the same length (prompts are left-padded with PAD), so
with `data.seq_len = doc_len - 1` each packed window is exactly one problem. Prompt tokens are
loss-masked by the families that read `data.answer_token` (nextlat, mtp): only targets after
that token within the same document count (`nsl.models.nextlat.answer_weights`).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Sequence

from nsl.data import datadir
from nsl.data.tasks import planning_dir
from nsl.data.tasks.planning_dir import PREFIX, TEST_FILE, load_test  # noqa: F401  (re-exported for readers)
from nsl.errors import ConfigError, DataError

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
  name, kwargs = parse_source(spec)
  try:
    return importlib.import_module(f"nsl.data.tasks.{name}").from_kwargs(**kwargs)
  except TypeError as e:
    raise ConfigError(f"task source {spec!r}: {e}") from None


def write_task(out_dir: str, spec: str, force: bool = False) -> dict:
  """Generates the planning task `spec` names into `out_dir` (`planning_dir.write`)."""
  return planning_dir.write(out_dir, spec, build(spec), force=force)


def ensure_task_prepared(out_dir: str, sources: Sequence[str]) -> dict:
  """The manifest of a task data dir, generating it first when missing; DataError when it holds
  another task than `sources` names."""
  name, kwargs = parse_source(sources[0])
  if name in LABELLED_TASKS:
    return _ensure_labelled(out_dir, name, kwargs)
  if os.path.isfile(os.path.join(out_dir, datadir.MANIFEST)):
    manifest = datadir.load_manifest(out_dir)
    if manifest.get("sources") != list(sources):
      raise DataError(f"data dir {out_dir} holds {manifest.get('sources')}, not {list(sources)}; "
                      "use another data.path or delete it")
    return manifest
  return write_task(out_dir, sources[0])


def _ensure_labelled(out_dir: str, name: str, kwargs: dict[str, int]) -> dict:
  """S5 / arithmetic: reuse `out_dir` when it holds that task, else generate it (defaults plus
  the source's k=v; the same as `python -m nsl.data.tasks.<name> --out=DIR`)."""
  if os.path.isfile(os.path.join(out_dir, datadir.MANIFEST)):
    manifest = datadir.load_manifest(out_dir)
    if manifest.get("task", {}).get("name") != name:
      raise DataError(f"data dir {out_dir} does not hold the {name} task; use another data.path or delete it")
    return manifest
  module = importlib.import_module(f"nsl.data.tasks.{name}")
  print(f"nsl: generating the {name} task into {out_dir} (python -m nsl.data.tasks.{name})", file=sys.stderr)
  try:
    return module.generate(out_dir, **kwargs)
  except TypeError as e:
    raise ConfigError(f"task source task:{name}: {e}") from None


def task_of(data_dir: str):
  """The task object a task data dir was generated from."""
  return build(datadir.load_manifest(data_dir)["sources"][0])
