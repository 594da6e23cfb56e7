"""The GCS emulator the storage tests share (tests/storage/emulator.py): one per test module,
with a bucket `bucket`, and this process's environment pointed at it while the module runs."""

import pytest

from tests.storage.emulator import bucket_env


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """The emulator with a bucket `bucket`; this process's environment points at it meanwhile."""
  with bucket_env(str(tmp_path_factory.mktemp("cache"))) as emu:
    yield emu
