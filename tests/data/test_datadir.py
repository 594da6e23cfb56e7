"""nsl.data.datadir: the one writer of the data-directory format, and the import graph around it."""

import ast
import os

import numpy as np
import pytest

from nsl.data import datadir
from nsl.errors import DataError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _manifest(splits):
  return {"format_version": datadir.FORMAT_VERSION, "sources": ["t"], "tokenizer": {"name": "byte"},
          "vocab_size": 257, "eos_id": 256, "dtype": "uint16", "splits": splits}


def test_staging_checks_before_installing_and_leaves_nothing(tmp_path):
  out = str(tmp_path / "d")
  tokens = np.arange(10, dtype="<u2")
  with datadir.Staging(out) as st:
    shard = datadir.write_shard(st.path, "train_00000.bin", tokens)
    bad = dict(shard, bytes=shard["bytes"] + 2)  # a writer's wrong record
    with pytest.raises(DataError, match="expected 22 bytes, found 20"):
      st.install(_manifest({"train": {"documents": 1, "tokens": 10, "shards": [bad]}}))
  assert os.listdir(tmp_path) == []  # neither out nor the staging dir
  with datadir.Staging(out) as st:
    shard = datadir.write_shard(st.path, "train_00000.bin", tokens)
    st.install(_manifest({"train": {"documents": 1, "tokens": 10, "shards": [shard]}}))
  m = datadir.load_manifest(out)
  datadir.verify_split(out, m, "train", full_checksum=True)
  assert os.listdir(tmp_path) == ["d"] and (os.stat(out).st_mode & 0o777) == 0o777 & ~_umask()
  with datadir.Staging(out) as st, pytest.raises(DataError, match="already exists; remove it or pass --force"):
    shard = datadir.write_shard(st.path, "train_00000.bin", tokens[:4])
    st.install(_manifest({"train": {"documents": 1, "tokens": 4, "shards": [shard]}}))
  assert datadir.load_manifest(out)["splits"]["train"]["tokens"] == 10 and os.listdir(tmp_path) == ["d"]


def _umask() -> int:
  m = os.umask(0)
  os.umask(m)
  return m


def test_labelled_dir_round_trips_labels(tmp_path):
  tok = np.arange(12, dtype="<u2").reshape(3, 4)
  lab = np.full((3, 4), datadir.LABEL_IGNORE, "<u2")
  m = datadir.write_labelled_dir(str(tmp_path / "l"), {"train": (tok, lab)}, tokenizer="task:x", vocab_size=20,
                                 eos_id=19, seed=0, val_fraction=0.0, extra={"name": "x"})
  assert m["label_ignore"] == datadir.LABEL_IGNORE and m["splits"]["train"]["label_shards"][0]["tokens"] == 12
  datadir.verify_split(str(tmp_path / "l"), datadir.load_manifest(str(tmp_path / "l")), "train", full_checksum=True)
  with pytest.raises(DataError, match="already prepared"):
    datadir.write_labelled_dir(str(tmp_path / "l"), {"train": (tok, lab)}, tokenizer="task:x", vocab_size=20,
                               eos_id=19, seed=0, val_fraction=0.0, extra={})


def _imports(path: str, modules: set[str]) -> set[str]:
  """nsl modules `path` imports anywhere (module or function level, importlib f-strings)."""
  found = set()
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args:
      if isinstance(node.args[0], ast.JoinedStr):
        prefix = "".join(v.value for v in node.args[0].values if isinstance(v, ast.Constant))
        found |= {m for m in modules if m.startswith(prefix)}
  return found & modules


def test_no_import_circle_among_the_data_modules():
  """No data module imports one that imports it back, deferred imports included (issue #18)."""
  paths = {}
  for d, _, files in os.walk(os.path.join(ROOT, "nsl", "data")):
    for f in files:
      if f.endswith(".py") and f != "__init__.py":
        paths[os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")] = os.path.join(d, f)
  paths["nsl.models.teacher"] = os.path.join(ROOT, "nsl", "models", "teacher.py")
  graph = {m: _imports(p, set(paths)) - {m} for m, p in paths.items()}

  def reach(start):
    seen, todo = set(), [start]
    while todo:
      for n in graph[todo.pop()]:
        if n not in seen:
          seen.add(n)
          todo.append(n)
    return seen

  circles = sorted(m for m in graph if m in reach(m))
  assert not circles, f"import circles through {circles}"
  assert all("nsl.data.prepare" not in graph[m] for m in ("nsl.data.tasks.s5", "nsl.data.tasks.task_data",
                                                          "nsl.models.teacher", "nsl.data.pipeline"))
