"""W&B (offline) and the jax.profiler trace: one tiny run logs to both; their config mistakes are
one line, exit status 2."""

import glob
import json
import os
import struct
import sys

import jax
import pytest

from nsl.errors import ConfigError
from nsl.train import loop, observe
from tests.helpers import ROOT, make_corpus, tiny_config


def read_wandb_records(path: str) -> list:
  """The protobuf Records of a .wandb file: wandb's transaction log is LevelDB's log format (a
  7-byte file header ":W&B" + magic + version, then 32 KiB blocks of records, each with a 7-byte
  header: CRC32, length, type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4). wandb >= 0.19 dropped its
  Python reader (wandb.sdk.internal.datastore), so the test reads the format itself."""
  from wandb.proto import wandb_internal_pb2

  block = 32768
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", data[:7]
  records, pending, pos = [], b"", 7
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's tail too short for a header is padding
      pos += block - pos % block
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    pos += 7
    if kind == 0:  # zero padding to the block's end
      pos += block - pos % block if pos % block else 0
      continue
    pending += data[pos:pos + length]
    pos += length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      records.append(record)
      pending = b""
  return records


def _history(records) -> dict[int, dict]:
  steps: dict[int, dict] = {}
  for r in records:
    if r.WhichOneof("record_type") == "history":
      items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
      steps.setdefault(int(items["_step"]), {}).update(items)
  return steps


def test_wandb_offline_and_the_profile_trace(tmp_path, monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path))
  data = make_corpus(str(tmp_path / "corpus"))
  config = tiny_config(data, **{"train.steps": 4, "train.eval_every": 4, "train.log_every": 2})
  config.log.wandb, config.log.wandb_project, config.log.wandb_mode = True, "nsl-test", "offline"
  config.train.profile_steps = (2, 3)
  workdir = str(tmp_path / "run")
  loop.Trainer(config, workdir, progress=False, devices=jax.devices()[:1]).run()

  traces = glob.glob(os.path.join(workdir, "profile", "plugins", "profile", "*", "*.xplane.pb"))
  assert len(traces) == 1, traces
  # the XSpace TensorBoard's profile plugin reads, holding the dispatch of the traced jitted steps
  events = [e.name for plane in jax.profiler.ProfileData.from_file(traces[0]).planes
            for line in plane.lines for e in line.events]
  assert "PjitFunction(train_step)" in events, sorted(set(events))[:20]  # the step by its name

  files = glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))
  assert len(files) == 1, files
  records = read_wandb_records(files[0])
  run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
  with open(os.path.join(workdir, "wandb_run_id")) as f:
    assert run.run_id == f.read().strip() and run.project == "nsl-test" and run.display_name == "run"
  logged_config = {u.key: json.loads(u.value_json) for u in run.config.update}
  assert logged_config["train"]["profile_steps"] == [2, 3] and logged_config["log"]["wandb"] is True
  # every scalar of metrics.jsonl, at its step
  want: dict[int, dict] = {}
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    r = json.loads(line)
    want.setdefault(r.pop("step"), {}).update(r)
  got = _history(records)
  assert sorted(got) == sorted(want) == [2, 4]
  assert "eval_val_nll" in want[4] and all("loss" in fields for fields in want.values())
  for step, fields in want.items():
    for k, v in fields.items():
      assert got[step][k] == pytest.approx(v), (step, k)


@pytest.mark.parametrize("steps, message", [
    ((0, 2), "needs 0 < a <= b <= train.steps=6"), ((3, 2), "needs 0 < a <= b"), ((2, 7), "b <= train.steps=6"),
    ((2,), "must be two step numbers"),
])
def test_bad_profile_steps(steps, message):
  config = tiny_config("unused", **{"train.profile_steps": steps})
  with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
    observe.validate(config)


def test_wandb_missing_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
  from nsl import launch

  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  rc = launch.main([f"--config={os.path.join(ROOT, 'configs', 'tiny.py')}", f"--workdir={tmp_path / 'run'}", "--config.log.wandb=true", "--quiet"])
  err = capsys.readouterr().err.strip()
  assert rc == 2 and err.count("\n") == 0 and "needs the wandb package: pip install -e '.[wandb]'" in err, err
