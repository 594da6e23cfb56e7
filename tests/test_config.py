"""Configs: the size ladder, overrides, and every inconsistent value as a one-line ConfigError."""

import json

import pytest

from nsl import config as nsl_config
from nsl.errors import ConfigError
from nsl.train import loop
from tests.helpers import run_cli


@pytest.mark.parametrize("size", ["xs", "s", "m", "l", "xl"])
def test_describe_reproduces_the_ladder(size):
  config = nsl_config.load_config(f"configs/sps.py:standard_{size}")
  nsl_config.validate(config)
  d = loop.describe(config)
  want = nsl_config.LADDER_PARAMS[size]
  assert abs(d["params_total"] - want) / want < 0.01, d
  assert d["params_embedding"] == 50304 * config.model.d_model
  assert d["params_embedding"] + d["params_non_embedding"] == d["params_total"]
  assert d["tokens_per_step"] == 4096 * 96
  # 6N plus the causal attention term 12·L·d·(T+1)/2 (REFERENCES §5 "Counting").
  m = config.model
  want_flops = 6 * d["params_total"] + 12 * m.n_layers * m.d_model * (4096 + 1) / 2
  assert d["flops_per_token"] == pytest.approx(want_flops, rel=1e-9)


def test_describe_cli_prints_one_json_line():
  out = run_cli("-m", "nsl.launch", "--config=configs/sps.py:standard_xl", "--mode=describe")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.strip().splitlines()
  assert len(lines) == 1
  d = json.loads(lines[0])
  assert {"family", "params_total", "params_embedding", "params_non_embedding", "flops_per_token",
          "tokens_per_step"} <= set(d)
  assert abs(d["params_total"] - 1.678e9) / 1.678e9 < 0.01


def test_overrides_are_typed():
  c = nsl_config.load_config("configs/tiny.py", [("train.steps", "7"), ("model.window", "16"),
                                                 ("checkpoint.async_save", "false"), ("train.lr", "1e-3"),
                                                 ("mesh.shape", "(2, -1, 1)")])
  assert c.train.steps == 7 and c.model.window == 16 and c.checkpoint.async_save is False
  assert c.train.lr == 1e-3 and tuple(c.mesh.shape) == (2, -1, 1)


@pytest.mark.parametrize("key,value,match", [
    ("model.n_heads", "5", "does not divide"),
    ("model.window", "100000", "window"),
    ("family", "nope", "unknown"),
    ("train.steps", "0", "train.steps must be positive"),
    ("train.steps", "-3", "train.steps must be positive"),
    ("train.grad_accum", "3", "grad_accum"),
    ("model.dtype", "float64", "dtype"),
    ("model.attention_impl", "magic", "attention_impl"),
    ("train.warmup_steps", "100000", "warmup_steps"),
])
def test_invalid_values_name_the_field(key, value, match):
  c = nsl_config.load_config("configs/tiny.py", [(key, value)])
  with pytest.raises(ConfigError, match=match):
    nsl_config.validate(c, num_devices=1)


def test_batch_not_divisible_by_devices():
  c = nsl_config.load_config("configs/tiny.py", [("train.batch_size", "12")])
  with pytest.raises(ConfigError, match="data-parallel devices"):
    nsl_config.validate(c, num_devices=8)


def test_unknown_key_suggests_the_right_one():
  with pytest.raises(ConfigError, match="did you mean 'train.steps'"):
    nsl_config.load_config("configs/tiny.py", [("train.stepz", "3")])


@pytest.mark.parametrize("args,match", [
    (["--config.train.stepz=3"], "unknown config key"),
    (["--config.train.steps=abc"], "not a valid int"),
    (["--config.model.n_heads=7"], "does not divide"),
])
def test_cli_user_errors_exit_2_with_one_line(tmp_path, args, match):
  out = run_cli("-m", "nsl.launch", "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}", *args)
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and match in lines[0], out.stderr


def test_missing_config_file_exit_2(tmp_path):
  out = run_cli("-m", "nsl.launch", f"--config={tmp_path}/none.py", "--mode=describe")
  assert out.returncode == 2 and "does not exist" in out.stderr


def _data_cli(tmp_path, data_dir):
  from tests.helpers import ROOT
  cfg = tmp_path / "cfg.py"
  cfg.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom tests.helpers import tiny_config\n"
                 f"def get_config():\n  return tiny_config({data_dir!r})\n")
  return run_cli("-m", "nsl.launch", f"--config={cfg}", f"--workdir={tmp_path / 'run'}")


def test_cli_corrupt_shard_exit_2(tmp_path):
  from tests.helpers import make_corpus
  data_dir = make_corpus(str(tmp_path), n=4, chars=3000)
  shard = tmp_path / "data" / "train_00000.bin"
  shard.write_bytes(shard.read_bytes()[:-10])
  out = _data_cli(tmp_path, data_dir)
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and "train_00000.bin" in lines[0], out.stderr


def test_cli_missing_manifest_exit_2(tmp_path):
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  (data_dir / "train_00000.bin").write_bytes(b"\0" * 64)  # shards without their manifest
  out = _data_cli(tmp_path, str(data_dir))
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1 and "manifest" in lines[0], out.stderr
