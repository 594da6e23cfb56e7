"""The runner's exact code, shipped to the machines that run a grid's cells (issue #53: "workers run
the runner's exact code"; docs/guide/pods.md).

`pack(root)` archives the checkout this runner runs from -- the files git would commit (tracked,
plus untracked ones not ignored: `git ls-files -co --exclude-standard`), or, outside a git
checkout, the installed `nsl` package tree -- as a reproducible tar.gz (sorted names, no times or
owners) named by the SHA-256 of its contents, and stores it once at ROOT/.code/<hash>.tar.gz
through `nsl.storage` (a local or shared directory, or gs://). Nothing else is shared between the
runner and the nodes: a worker fetches the archive with `FETCH_PY` (run by a Python that has nsl's
dependencies, not nsl: fsspec/gcsfs for gs://, `STORAGE_EMULATOR_HOST` honoured), checks its hash
and unpacks it into node-local scratch, then runs the cell from there (a cell's config path is
relative to that code root). The same code therefore gives the same archive name, and a changed
file a new one, so a cell never runs a half-updated tree.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

from nsl import storage
from nsl.errors import ConfigError, NslError

CODE_DIR = ".code"  # under the grid root
HASH_CHARS = 16
MAX_BYTES = 256 << 20  # more is a data or run folder git does not ignore, not code


def source_root() -> str:
  """The code root this runner runs from: the git work tree holding the imported `nsl` package,
  else the directory the installed package sits in (site-packages)."""
  return str(Path(__file__).resolve().parents[2])


def _is_git_tree(source: str) -> bool:
  probe = subprocess.run(["git", "-C", source, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
  return probe.returncode == 0 and os.path.realpath(probe.stdout.strip()) == os.path.realpath(source)


def files(source: str) -> list[str]:
  """The relative paths to ship, sorted: the checkout's (module docstring) or the package tree's."""
  if _is_git_tree(source):
    out = subprocess.run(["git", "-C", source, "ls-files", "-co", "--exclude-standard", "-z"], capture_output=True,
                         check=True).stdout.decode()
    names = {n for n in out.split("\0") if n}
    # listed but not a file here: deleted in the work tree, or a submodule's directory
    present = lambda n: os.path.isfile(os.path.join(source, n)) or os.path.islink(os.path.join(source, n))
    return sorted(filter(present, names))
  package = os.path.join(source, "nsl")
  if not os.path.isdir(package):
    raise NslError(f"cannot ship the code: {source} is neither a git checkout nor holds the nsl package")
  found = []
  for top, dirs, names in os.walk(package):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    found += [os.path.relpath(os.path.join(top, n), source) for n in names if not n.endswith((".pyc", ".so"))]
  return sorted(found)


def archive(source: str) -> tuple[bytes, str]:
  """(tar.gz bytes, content hash) of `files(source)`: the same files give the same bytes."""
  names = files(source)
  sizes = {n: os.lstat(os.path.join(source, n)).st_size for n in names}
  if sum(sizes.values()) > MAX_BYTES:
    largest = sorted(sizes, key=sizes.get, reverse=True)[:3]
    raise ConfigError(f"the code to ship from {source} is {sum(sizes.values()) >> 20} MB (largest: "
                      f"{', '.join(largest)}); git ignores none of it: add data and run folders to .gitignore")
  raw = io.BytesIO()
  with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
    for name in names:
      path = os.path.join(source, name)
      info = tarfile.TarInfo(name)
      info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
      if os.path.islink(path):
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
        tar.addfile(info)
        continue
      with open(path, "rb") as f:
        data = f.read()
      info.size, info.mode = len(data), 0o755 if os.access(path, os.X_OK) else 0o644
      tar.addfile(info, io.BytesIO(data))
  digest = hashlib.sha256(raw.getvalue()).hexdigest()[:HASH_CHARS]
  packed = io.BytesIO()
  with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0, filename="") as gz:
    gz.write(raw.getvalue())
  return packed.getvalue(), digest


def code_hash(uri: str) -> str:
  """The content hash an archive's name carries."""
  return storage.basename(uri).split(".", 1)[0]


def pack(root: str, source: str | None = None) -> str:
  """Stores the archive of `source` (default: this runner's code) at ROOT/.code/<hash>.tar.gz,
  unless it is already there; returns its path or gs:// URI."""
  data, digest = archive(source or source_root())
  directory = storage.join(storage.resolve(root), CODE_DIR)
  uri = storage.join(directory, f"{digest}.tar.gz")
  if storage.exists(uri):
    return uri
  storage.makedirs(directory)
  fd, tmp = tempfile.mkstemp(prefix=f".{digest}.", suffix=".part", dir=None if storage.is_remote(uri) else directory)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    if storage.is_remote(uri):
      storage.upload(tmp, uri)
    else:
      os.chmod(tmp, 0o644)
      os.replace(tmp, uri)  # a reader never sees half an archive
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return uri


# The worker's side, run as `PYTHON -c FETCH_PY URI DEST` before nsl exists there: reads the archive
# (a local path, or a URL through fsspec -- gcsfs for gs://, pointed at $STORAGE_EMULATOR_HOST when
# set, as nsl.storage does), checks that its contents have the hash its name says, and unpacks it
# into DEST. Exit 2 with one line when the archive is missing or not the one named.
FETCH_PY = r'''
import gzip, hashlib, io, os, sys, tarfile
uri, dest = sys.argv[1], sys.argv[2]
try:
  if "://" in uri and not uri.startswith("file://"):
    import fsspec
    options = {}
    if uri.startswith("gs://") and os.environ.get("STORAGE_EMULATOR_HOST", "") not in ("", "default"):
      options["token"] = "anon"
      os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    with fsspec.open(uri, "rb", **options) as f:
      data = f.read()
  else:
    with open(uri[len("file://"):] if uri.startswith("file://") else uri, "rb") as f:
      data = f.read()
except Exception as e:
  sys.exit(f"nsl: cannot fetch the cell's code {uri}: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
raw = gzip.decompress(data)
want = os.path.basename(uri).split(".", 1)[0]
if hashlib.sha256(raw).hexdigest()[:len(want)] != want:
  print(f"nsl: the code archive {uri} does not hold what its name says (a partial upload?)", file=sys.stderr)
  sys.exit(2)
with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
  if hasattr(tarfile, "data_filter"):
    tar.extractall(dest, filter="data")
  else:
    tar.extractall(dest)
'''


def fetch(uri: str, dest: str, python: str | None = None) -> None:
  """Runs `FETCH_PY` (as a worker would) to unpack `uri` into `dest`; NslError on failure."""
  import sys

  proc = subprocess.run([python or sys.executable, "-c", FETCH_PY, uri, dest], capture_output=True, text=True)
  if proc.returncode != 0:
    raise NslError((proc.stderr.strip().splitlines() or [f"fetching {uri} failed"])[-1])
