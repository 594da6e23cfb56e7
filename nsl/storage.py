"""Paths that name a local directory or object storage (`gs://bucket/dir`), through `etils.epath`,
the path type Orbax itself uses (docs/guide/storage.md).

A local path keeps its old meaning (made absolute, plain `os` calls). A remote one is used as
written: Orbax writes its checkpoints there (arrays through TensorStore, the rest through epath
over gcsfs). What needs a POSIX file (memory-mapped data shards, metrics.jsonl appended line by
line, TensorBoard events) is kept in a local cache beside it (`$NSL_CACHE_DIR`, default
`~/.cache/nsl`) and copied up or down whole.

`STORAGE_EMULATOR_HOST` (what gsutil, gcsfs and google-cloud-storage read) is all it takes to
point nsl at a GCS emulator: importing this module hands it on to TensorStore, which reads its
own variable, and keeps gcsfs off Google's credential and bucket-layout services.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Iterable

from nsl.errors import ConfigError, NslError

LOCK_SCHEMES = ("gs",)  # schemes whose create-only write makes the workdir lock sound


def configure() -> None:
  """Points every GCS client at `$STORAGE_EMULATOR_HOST` when it is set; quiets gcsfs, which logs
  each retried request as a traceback (nsl reports a failed one itself, in one line)."""
  logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
  host = os.environ.get("STORAGE_EMULATOR_HOST", "")
  if host in ("", "default"):
    return
  url = host if host.startswith(("http://", "https://")) else f"http://{host}"
  os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url)
  # TensorStore asks for a token before each request; an emulator accepts any.
  os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
  # gcsfs >= 2025 asks the Storage Control API for each bucket's layout, which an emulator lacks
  # (its fallback runs inside Orbax's finalize thread and has been seen to stall it).
  os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
  try:
    import fsspec

    fsspec.config.conf.setdefault("gcs", {}).setdefault("token", "anon")
  except ImportError:
    pass


configure()


def scheme(path: str) -> str:
  """'gs' for gs://..., '' for a local path."""
  head, sep, _ = str(path).partition("://")
  return head.lower() if sep and head.lower() != "file" else ""


def is_remote(path: str) -> bool:
  return bool(scheme(path))


def resolve(path: str) -> str:
  """A local path made absolute; a remote one as written, without a trailing slash."""
  path = str(path)
  if is_remote(path):
    return path.rstrip("/")
  if path.startswith("file://"):
    path = path[len("file://"):]
  return os.path.abspath(path)


def join(base: str, *names: str) -> str:
  if is_remote(base):
    return "/".join([str(base).rstrip("/"), *(n.strip("/") for n in names)])
  return os.path.join(base, *names)


def basename(path: str) -> str:
  return str(path).rstrip("/").rsplit("/", 1)[-1] if is_remote(path) else os.path.basename(os.path.normpath(path))


def dirname(path: str) -> str:
  return str(path).rstrip("/").rsplit("/", 1)[0] if is_remote(path) else os.path.dirname(os.path.normpath(path))


def Path(path: str):  # noqa: N802 - a constructor, as epath.Path
  from etils import epath

  return epath.Path(resolve(path))


def _fs(path: str, **kwargs):
  import fsspec

  return fsspec.filesystem(scheme(path), **kwargs)


def _fresh(path: str):
  """The filesystem of `path` with its listing cache dropped: another process (a trainer, Orbax's
  commit thread) may have written there since this one last looked."""
  fs = _fs(path)
  fs.invalidate_cache()
  return fs


def exists(path: str) -> bool:
  return _fresh(path).exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  """For object storage: some object lies under `path/` (a prefix is a directory)."""
  return _fresh(path).isdir(path) if is_remote(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
  return _fresh(path).isfile(path) if is_remote(path) else os.path.isfile(path)


def listdir(path: str) -> list[str]:
  if is_remote(path):
    fs = _fresh(path)
    return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)) if fs.isdir(path) else []
  return sorted(os.listdir(path))


def rmtree(path: str) -> None:
  if is_remote(path):
    fs = _fs(path)
    fs.invalidate_cache()
    if fs.exists(path):
      fs.rm(path, recursive=True)
  else:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def makedirs(path: str) -> None:
  """A no-op on object storage (a prefix exists once an object is under it)."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def read_text(path: str) -> str:
  if is_remote(path):
    return Path(path).read_text()
  with open(path, encoding="utf-8") as f:
    return f.read()


def write_text(path: str, text: str) -> None:
  """Atomic for readers: a local file is written aside and renamed; an object is replaced whole."""
  if is_remote(path):
    Path(path).write_text(text)
    return
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def remove(path: str) -> None:
  if is_remote(path):
    Path(path).unlink(missing_ok=True)
  elif os.path.exists(path):
    os.remove(path)


def rename(src: str, dst: str) -> None:
  """A directory rename; on object storage a copy and delete of every object (not atomic)."""
  if is_remote(src):
    _fs(src).mv(src, dst, recursive=True)
  else:
    os.rename(src, dst)


def create_exclusive(path: str, text: str) -> bool:
  """Writes `path` only if nothing is there (O_EXCL locally, GCS's ifGenerationMatch=0 in a
  bucket); False when something is. Other object stores have no such write: ConfigError."""
  if not is_remote(path):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return True
  if scheme(path) not in LOCK_SCHEMES:
    raise ConfigError(f"{path}: {scheme(path)}:// has no create-only write, so nsl cannot lock a workdir there; "
                      "use a gs:// or local --workdir")
  try:
    _fs(path).pipe_file(path, text.encode(), mode="create")
  except FileExistsError:
    return False
  return True


def read_versioned(path: str) -> tuple[str, str | None]:
  """(text, version): a bucket object's text with its generation (read at that generation, so the
  two belong together); a local file's text with None."""
  if not is_remote(path):
    return read_text(path), None
  fs = _fs(path, version_aware=True)  # reads `path#generation` as that generation
  fs.invalidate_cache()
  generation = str(fs.info(path).get("generation") or "") or None
  data = fs.cat_file(f"{path}#{generation}" if generation else path)
  return data.decode(), generation


def remove_version(path: str, version: str | None) -> None:
  """Deletes `path` only while it is still `version` (a bucket object's generation): a lock that
  another process replaced meanwhile is left alone. Local paths: a plain delete."""
  if not is_remote(path) or version is None:
    remove(path)
    return
  fs = _fs(path)
  bucket, key = path.split("://", 1)[1].split("/", 1)
  try:  # GCS's precondition: 412 when the object is another generation now (fake-gcs-server
    # ignores it, so the tests cannot see this race; real GCS enforces it)
    fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=version)
  except Exception:  # 412 or gone: someone else's lock now; the create-only retry decides
    pass
  fs.invalidate_cache()


def check_bucket(path: str, flag: str) -> None:
  """ConfigError (one line) when `path`'s bucket is missing or cannot be reached."""
  if not is_remote(path):
    return
  bucket = f"{scheme(path)}://{str(path).split('://', 1)[1].split('/', 1)[0]}"
  try:
    found = Path(bucket).exists()
  except ImportError as e:  # etils names no package (e.name is None): gs:// is gcsfs, the [gcs] extra
    need = "the gcsfs package: pip install -e '.[gcs]'" if scheme(path) == "gs" else f"a package ({_short(e)})"
    raise ConfigError(f"{flag}={path}: reading {scheme(path)}:// needs {need}") from None
  except Exception as e:  # connection refused, DNS, credentials: the client's own words
    raise ConfigError(f"{flag}={path}: cannot reach {bucket} ({type(e).__name__}: {_short(e)}); check the "
                      "credentials and network (or STORAGE_EMULATOR_HOST for an emulator)") from None
  if not found:
    raise ConfigError(f"{flag}={path}: bucket {bucket} does not exist (or these credentials cannot see it); "
                      "create it or fix the path")


def _short(e: BaseException) -> str:
  return " ".join(str(e).split())[:160]


# -- local copies -------------------------------------------------------------------------------
def cache_root() -> str:
  return os.path.abspath(os.path.expanduser(os.environ.get("NSL_CACHE_DIR") or "~/.cache/nsl"))


def cache_dir(kind: str, remote: str) -> str:
  """`$NSL_CACHE_DIR/<kind>/<name>-<hash of the URL>`: one local directory per remote one."""
  url = resolve(remote)
  digest = hashlib.sha256(url.encode()).hexdigest()[:12]
  return os.path.join(cache_root(), kind, f"{basename(url)}-{digest}")


def download(src: str, dst: str) -> None:
  """Copies one object to a local file, written aside and renamed (a kill leaves no half file)."""
  os.makedirs(os.path.dirname(dst), exist_ok=True)
  tmp = f"{dst}.part{os.getpid()}"
  try:
    _fs(src).get_file(src, tmp)
    os.replace(tmp, dst)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def upload(src: str, dst: str) -> None:
  _fs(dst).put_file(src, dst)


class Records:
  """Where a run's records are written: the workdir itself when local; for a remote workdir a
  local directory (`$NSL_CACHE_DIR/runs/...`) whose files `push()` copies up whole (objects
  cannot be appended to, and tensorboardX writes only POSIX files without TensorFlow).

  `pull()` first brings an earlier attempt's records down, so a resume on another machine
  continues metrics.jsonl instead of starting it anew."""

  FILES = ("config.json", "metrics.jsonl", "result.json", "wandb_run_id")
  FOLDERS = ("tb", "profile")  # TensorBoard events, jax.profiler traces

  def __init__(self, workdir: str, local: str | None = None):
    """`local`: another local directory than the trainer's cache (a reader must not replace the
    files a trainer of the same run on this host has open)."""
    self.workdir = resolve(workdir)
    self.remote = is_remote(self.workdir)
    self.local = (local or cache_dir("runs", self.workdir)) if self.remote else self.workdir

  def pull(self) -> None:
    if not self.remote:
      return
    names = set(listdir(self.workdir))
    if not names & set(self.FILES):  # a new run at this URL: nothing of an earlier one goes up
      import shutil

      shutil.rmtree(self.local, ignore_errors=True)
    os.makedirs(self.local, exist_ok=True)
    for name in self.FILES:
      src = join(self.workdir, name)
      if name in names:
        download(src, os.path.join(self.local, name))
      elif os.path.exists(os.path.join(self.local, name)):
        os.remove(os.path.join(self.local, name))  # a stale copy of another run at this URL

  def push(self, names: Iterable[str] = FILES) -> None:
    """Copies the records (and the TensorBoard folder) up; a no-op for a local workdir."""
    if not self.remote:
      return
    for name in names:
      src = os.path.join(self.local, name)
      if os.path.isfile(src):
        upload(src, join(self.workdir, name))
    for folder in self.FOLDERS:
      for root, _, files in os.walk(os.path.join(self.local, folder)):
        for f in files:
          rel = os.path.relpath(os.path.join(root, f), self.local)
          upload(os.path.join(root, f), join(self.workdir, *rel.split(os.sep)))


def read_json(path: str, what: str) -> dict:
  """A JSON file (local or remote); NslError naming `what` when it is not JSON."""
  try:
    return json.loads(read_text(path))
  except ValueError as e:
    raise NslError(f"{what} {path} is not valid JSON ({_short(e)})") from None
