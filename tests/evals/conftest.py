"""The trained run the evaluation tests share."""

import pytest

from tests.helpers import make_corpus, run_cli, tiny_config


@pytest.fixture(scope="session")
def tiny_byte_run(tmp_path_factory):
  """(workdir, data dir, config) of a tiny standard run (2 layers, d 32, byte tokens, seq_len 64)
  trained 4 steps by the launcher (one device: faster to compile and save than in-process with
  the tests' 8 fake devices); the evals then run on those 8 devices. Session-scoped: the test files
  that read it (nll/zeroshot, lm-eval) train it once when they share a worker. Tests may add to its
  result.json but change nothing else."""
  d = tmp_path_factory.mktemp("tiny_byte_run")
  data = make_corpus(str(d))
  workdir = str(d / "run")
  config = tiny_config(data, **{"train.eval_batches": 3})
  overrides = {"data.path": data, "data.sources": tuple(config.data.sources), "data.tokenizer": "byte",
               "data.val_fraction": 0.2, "model.vocab_size": 257, "model.d_model": 32, "model.n_layers": 2,
               "model.n_heads": 2, "model.d_ff": 96, "model.attention_chunk": 16, "data.seq_len": 64,
               "train.batch_size": 8, "train.steps": 4, "train.warmup_steps": 1, "train.decay_steps": 1,
               "train.eval_batches": 3, "checkpoint.async_save": False}
  out = run_cli("-m", "nsl.launch", "--config=configs/base.py", f"--workdir={workdir}", "--quiet",
                *(f"--config.{k}={v}" for k, v in overrides.items()))
  assert out.returncode == 0, out.stderr[-2000:]
  return workdir, data, config
