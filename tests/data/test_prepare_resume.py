"""prepare --workers and resume: the same bytes as before the change, for any worker count, after a kill."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from nsl.data import encode_pool
from nsl.data import prepare as prepare_lib
from nsl.data import prepare_resume
from nsl.data import sources as sources_lib
from nsl.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Digests of this corpus prepared by the single-process prepare before --workers existed (commit
# 50a7df1), taken with `dir_digest`: the parallel, resumable prepare must write the same bytes.
REFERENCE = {
    "byte": "13d4a163fa3d036c3b0aa1b4beb226f0bc2bd8d7d4360fab3e314c096a42f057",
    "bpe": "0524a6b376a6fe2b240fe88390665bdfa601117b4f51913007c8b7d36b9b8aab",
    "gpt2": "da779aedb365f92d257c337311ac9ef045c2f77316e62d4d727ca302294c82d0",
}
ARGS = dict(vocab_size=300, val_fraction=0.2, seed=0, shard_tokens=500)


def dir_digest(d):
  """sha256 over every file of a data dir; the manifest without its timing and source paths."""
  h = hashlib.sha256()
  for name in sorted(os.listdir(d)):
    with open(os.path.join(d, name), "rb") as f:
      data = f.read()
    if name == "manifest.json":
      m = json.loads(data)
      m.pop("prepare_seconds")
      m.pop("sources")
      data = json.dumps(m, sort_keys=True).encode()
    h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
  return h.hexdigest()


@pytest.fixture(name="spec")
def spec_fixture(corpus60):
  return corpus60


@pytest.mark.parametrize("tokenizer,workers", [("byte", (1, 2, 3)), ("bpe", (1, 2)), ("gpt2", (1, 2))])
def test_any_worker_count_writes_the_reference_bytes(spec, gpt2_ranks, tmp_path, monkeypatch, tokenizer, workers):
  if tokenizer == "gpt2":
    monkeypatch.setenv("NSL_GPT2_BPE", gpt2_ranks)
  for n in workers:
    out = str(tmp_path / f"w{n}")
    prepare_lib.prepare(out, [spec], tokenizer, workers=n, **ARGS)
    assert dir_digest(out) == REFERENCE[tokenizer], (tokenizer, n)
  assert sorted(os.listdir(tmp_path)) == [f"w{n}" for n in workers]  # no partial dir or lock left


def test_interrupt_keeps_the_work_and_a_rerun_resumes(spec, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(encode_pool, "CHUNK_DOCS", 7)
  real, calls = encode_pool.encode_batch, []

  def interrupted(tok, texts):
    calls.append(len(texts))
    if len(calls) == 5:
      raise KeyboardInterrupt
    return real(tok, texts)

  monkeypatch.setattr(encode_pool, "encode_batch", interrupted)
  out = str(tmp_path / "d")
  with pytest.raises(KeyboardInterrupt):
    prepare_lib.prepare(out, [spec], "bpe", **ARGS)
  partial = tmp_path / ".d.partial"
  assert not os.path.exists(out) and (partial / prepare_resume.JOURNAL).is_file()
  monkeypatch.setattr(encode_pool, "encode_batch", real)
  prepare_lib.prepare(out, [spec], "bpe", **ARGS)
  err = capsys.readouterr().err
  assert "resuming at document 28 " in err  # 4 batches of 7 documents were done
  assert "training a 300-token BPE" in err.split("resuming")[0] and err.count("training") == 1
  assert dir_digest(out) == REFERENCE["bpe"]
  assert sorted(os.listdir(tmp_path)) == ["d"]


def test_other_settings_start_over(spec, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(encode_pool, "CHUNK_DOCS", 7)
  monkeypatch.setattr(encode_pool, "encode_batch", lambda tok, texts: (_ for _ in ()).throw(KeyboardInterrupt))
  out = str(tmp_path / "d")
  with pytest.raises(KeyboardInterrupt):
    prepare_lib.prepare(out, [spec], "byte", **dict(ARGS, seed=1))
  monkeypatch.undo()
  prepare_lib.prepare(out, [spec], "byte", **ARGS)
  assert "starting over; discarding an unfinished prepare of other settings" in capsys.readouterr().err
  assert dir_digest(out) == REFERENCE["byte"]


_STALLED = """
import sys, time
from nsl.data import encode_pool, prepare
encode_pool.CHUNK_DOCS = 5
real, calls = encode_pool.encode_batch, []
def stalled(tok, texts):
  calls.append(1)
  if len(calls) == 6:
    time.sleep(600)  # killed here by the test
  return real(tok, texts)
encode_pool.encode_batch = stalled
sys.exit(prepare.main(sys.argv[1:]))
"""


def test_sigkilled_prepare_resumes_to_the_same_bytes(spec, tmp_path):
  out = tmp_path / "d"
  argv = [f"--source={spec}", "--tokenizer=byte", f"--out={out}", "--val_fraction=0.2", "--shard_tokens=500"]
  proc = subprocess.Popen([sys.executable, "-c", _STALLED] + argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
  journal = tmp_path / ".d.partial" / prepare_resume.JOURNAL
  deadline = time.time() + 120
  next_doc = 0
  while next_doc < 25 and time.time() < deadline and proc.poll() is None:
    time.sleep(0.05)
    try:
      with np.load(journal) as z:
        next_doc = json.loads(bytes(z["state"]).decode())["next_doc"]
    except (OSError, ValueError, KeyError, EOFError):
      pass
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=30)
  assert next_doc == 25 and not out.exists()  # 5 batches of 5 documents journalled, then stalled
  done = subprocess.run([sys.executable, "-m", "nsl.data.prepare"] + argv + ["--workers=2"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert "resuming at document 25 " in done.stderr
  assert dir_digest(str(out)) == REFERENCE["byte"]


def test_bad_worker_count_is_a_config_error(spec, tmp_path):
  with pytest.raises(ConfigError, match="workers=0 must be a positive integer"):
    prepare_lib.prepare(str(tmp_path / "d"), [spec], "byte", workers=0)
  assert os.listdir(tmp_path) == []


def test_documents_from_an_index(tmp_path):
  for i, text in enumerate(["a", "", "b", "c", "", "d"]):
    (tmp_path / f"f{i}.txt").write_text(text)
  (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ["x", "", "y", "z"]))
  specs = [str(tmp_path / "*.txt"), f"jsonl:{tmp_path}/d.jsonl"]
  every = list(sources_lib.iter_documents(specs))
  assert every == ["a", "b", "c", "d", "x", "y", "z"]
  for start in range(len(every) + 2):
    assert list(sources_lib.iter_documents(specs, start=start)) == every[start:]
    assert list(sources_lib.iter_documents(specs, max_docs=5, start=start)) == every[start:5]
