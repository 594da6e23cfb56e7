"""A grid root in a bucket, read by the analysis on this host (docs/guide/pods.md#analysis).

`nsl.scaling.fit` and `nsl.scaling.plot` read a root's small record files and write fits.json and
plots/; for a `gs://` root they work on a local mirror of those records
(`$NSL_CACHE_DIR/grids/...`: each run's result.json and config.json, the cells' cell.json and
status.json, the root's fits.json) and copy what they wrote back up. Checkpoints and metrics never
come down.
"""

from __future__ import annotations

import os

from nsl import storage

RUN_FILES = ("result.json", "config.json", "cell.json", "status.json")
ROOT_FILES = ("fits.json", "grid.json")


def _pull_dir(remote: str, local: str, names: tuple[str, ...]) -> bool:
  present = set(storage.listdir(remote))
  for name in names:
    if name in present:
      storage.download(storage.join(remote, name), os.path.join(local, name))
  return bool(present & set(names))


def pull(root: str) -> str:
  """The local mirror of `root`'s records (runs at depth 1 or 2, as `nsl.scaling.records` reads)."""
  root = storage.resolve(root)
  local = storage.cache_dir("grids", root)
  os.makedirs(local, exist_ok=True)
  _pull_dir(root, local, ROOT_FILES)
  for child in storage.listdir(root):
    if child.startswith(".") or child in ("plots", "data"):
      continue
    remote = storage.join(root, child)
    if not storage.isdir(remote):
      continue
    if not _pull_dir(remote, os.path.join(local, child), RUN_FILES):
      for grandchild in storage.listdir(remote):  # a group of runs: ROOT/<group>/<run_id>/
        sub = storage.join(remote, grandchild)
        if storage.isdir(sub):
          _pull_dir(sub, os.path.join(local, child, grandchild), RUN_FILES)
  return local


def push(local: str, root: str, names: tuple[str, ...]) -> None:
  """Copies files or folders `names` of the mirror back up to `root`."""
  for name in names:
    path = os.path.join(local, name)
    if os.path.isfile(path):
      storage.upload(path, storage.join(root, name))
    for folder, _, files in os.walk(path) if os.path.isdir(path) else ():
      for f in files:
        rel = os.path.relpath(os.path.join(folder, f), local)
        storage.upload(os.path.join(folder, f), storage.join(root, *rel.split(os.sep)))
