"""The GCS emulator the storage tests share (tests/storage/emulator.py): one per test module,
with a bucket `bucket`, and this process's environment pointed at it while the module runs."""

import os

import pytest

from nsl import storage
from tests.storage.emulator import Emulator


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """The emulator with a bucket `bucket`; this process's environment points at it meanwhile."""
  saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL",
                                          "GOOGLE_AUTH_TOKEN_FOR_TESTING", "NSL_CACHE_DIR")}
  with Emulator() as emu:
    emu.make_bucket("bucket")
    os.environ.update(emu.env(), NSL_CACHE_DIR=str(tmp_path_factory.mktemp("cache")))
    for k in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
      os.environ.pop(k, None)
    storage.configure()
    try:
      yield emu
    finally:
      for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
