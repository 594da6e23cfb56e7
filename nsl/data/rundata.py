"""What a run keeps of its data dir, so that reading the run needs no data dir (docs/reference/records.md).

At the start of a run the trainer's process 0 writes (`save`, local or gs:// workdir alike):

  WORKDIR/tokenizer/data.json        the data manifest's tokenizer spec, vocab_size, eos_id and
                                     dtype, the data dir (`data`, absolute or gs://) and the dir the
                                     tokenizer came from (`tokenizer_source`: a mixture's first)
  WORKDIR/tokenizer/tokenizer.json   the BPE's file, or `gpt2.tiktoken` (GPT-2's ranks), copied from
                                     the data dir byte for byte (the byte tokenizer has no file)

so `WORKDIR/tokenizer` reads like a data dir's tokenizer: `load_tokenizer(spec, dir)` and
`datadir.tokenizer_fingerprint` work on it unchanged. Readers (`nsl.generate`, `nsl.hf export`,
the evaluations, lm-eval's model) take the tokenizer from there (`tokenizer`), from any working
directory, with the run copied anywhere. A run recorded before this file existed has no
`tokenizer/data.json`: its tokenizer is read from its data dir, as then. Evaluations that score
the data dir's splits find it with `data_dir`: where the run read it (`data`), else
`config.data.path` from the current directory, else one line naming it.
"""

from __future__ import annotations

import json
import os
import shutil

from nsl import storage
from nsl.data import datadir
from nsl.errors import DataError

DIR = "tokenizer"
INFO = "data.json"
FORMAT_VERSION = 1


def _source(config) -> str:
  """The data dir whose tokenizer the run uses: config.data.path, or a mixture's first source."""
  if config.data.mixture:
    from nsl.data import mixture

    return mixture.parse(config.data.mixture)[0].path
  return str(config.data.path)


def _copy(src: str, dst: str) -> None:
  """A local file to a local path (aside, then renamed: a reader never sees half) or an object."""
  if storage.is_remote(dst):
    storage.upload(src, dst)
    return
  tmp = f"{dst}.tmp{os.getpid()}"
  shutil.copyfile(src, tmp)
  os.replace(tmp, dst)


def save(workdir: str, config) -> dict:
  """Writes WORKDIR/tokenizer/ (module docstring) from the run's prepared data dir; returns data.json."""
  source = _source(config)
  local = datadir.fetch(source)  # a gs:// data dir: its local copy, already fetched by the trainer
  manifest = datadir.load_manifest(local)
  out = storage.join(storage.resolve(workdir), DIR)
  storage.makedirs(out)
  name = datadir.tokenizer_file(manifest)
  if name:
    src = os.path.join(local, name)
    if not os.path.isfile(src):
      raise DataError(f"tokenizer file {src} is missing; re-run nsl.data.prepare for {source}")
    _copy(src, storage.join(out, name))
  info = {"format_version": FORMAT_VERSION, "tokenizer": manifest["tokenizer"],
          "vocab_size": int(manifest["vocab_size"]), "eos_id": int(manifest["eos_id"]), "dtype": manifest["dtype"],
          "data": None if config.data.mixture else storage.resolve(str(config.data.path)),
          "tokenizer_source": storage.resolve(source)}
  if isinstance(manifest.get("task"), dict):  # a task dir (planning, S5, arithmetic)
    info["task"] = manifest["task"].get("name")
  storage.write_text(storage.join(out, INFO), json.dumps(info, indent=1, sort_keys=True) + "\n")
  return info


def local_dir(workdir: str) -> str | None:
  """A local directory holding the run's data.json and tokenizer file (a gs:// run's is copied to
  $NSL_CACHE_DIR first); None for a run recorded without them."""
  remote = storage.join(storage.resolve(workdir), DIR)
  if not storage.isfile(storage.join(remote, INFO)):
    return None
  if not storage.is_remote(remote):
    return remote
  local = storage.cache_dir("run_tokenizer", remote)
  os.makedirs(local, exist_ok=True)
  for name in storage.listdir(remote):
    storage.download(storage.join(remote, name), os.path.join(local, name))
  return local


def read_info(directory: str) -> dict:
  path = os.path.join(directory, INFO)
  try:
    with open(path, encoding="utf-8") as f:
      info = json.load(f)
  except json.JSONDecodeError as e:
    raise DataError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); copy the run's "
                    "tokenizer/ folder again") from None
  missing = [k for k in ("tokenizer", "vocab_size", "eos_id") if k not in info]
  if missing:
    raise DataError(f"{path} lacks {', '.join(map(repr, missing))}; copy the run's tokenizer/ folder again")
  return info


def info(workdir: str) -> dict | None:
  """The run's data.json (None: a run recorded before it existed)."""
  d = local_dir(workdir)
  return None if d is None else read_info(d)


def fingerprint(workdir: str) -> str | None:
  """`datadir.tokenizer_fingerprint` of the run's own tokenizer (None: none recorded)."""
  d = local_dir(workdir)
  return None if d is None else datadir.tokenizer_fingerprint(d, read_info(d))


def tokenizer(workdir: str, config, data: str | None = None):
  """(tokenizer, EOS id, directory of its file) of a run: from the data dir `data` when given,
  else the run's own copy (WORKDIR/tokenizer), else (a run recorded before it) its data dir."""
  from nsl.data import tokenizers

  if data is None:
    d = local_dir(workdir)
    if d is not None:
      meta = read_info(d)
      return tokenizers.load_tokenizer(meta["tokenizer"], d), int(meta["eos_id"]), d
    data = str(config.data.path)
    if not storage.is_remote(data) and not os.path.isdir(data):
      raise DataError(f"the run's data dir {data!r} (config data.path) is not here, and the tokenizer is exported "
                      "from it; run from the directory the run was launched from, or pass --data=DIR")
  local = datadir.fetch(data)
  manifest = datadir.load_manifest(local)
  return tokenizers.load_tokenizer(manifest["tokenizer"], local), int(manifest["eos_id"]), local


def data_dir(workdir: str | None, config, flag: str | None = "--data") -> str:
  """The local directory of the run's own data (its splits): where the run read it (data.json's
  `data`), else config.data.path from here (a gs:// one: its local copy); DataError naming it (and
  `flag`, the reader's option that names another dir)."""
  path = str(config.data.path)
  if storage.is_remote(path):
    return datadir.fetch(path)
  meta = info(workdir) if workdir else None
  recorded = (meta or {}).get("data")
  for candidate in (recorded, path):
    if candidate and os.path.isfile(os.path.join(candidate, datadir.MANIFEST)):
      return candidate
  where = f", read by the run at {recorded}" if recorded and recorded != os.path.abspath(path) else ""
  other = f", or pass {flag}=DIR" if flag else ""
  raise DataError(f"the run's data dir {path!r} (config data.path{where}) is not here, and this evaluation "
                  f"reads its data; run from the directory the run was launched from{other}")
