"""`python -m nsl.bench.decode --draft_lens=...` on a nextlat config: one run measures every draft
length side by side with plain decoding, and greedy speculative output equals plain greedy
decoding at each length (the invariant of nsl/speculative.py, here through the sweep)."""

import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import nextlat as nextlat_configs
from nsl.bench import decode as bench_decode
from nsl.errors import ConfigError
from nsl.models import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--config.model.vocab_size=64", "--config.model.d_model=32", "--config.model.n_layers=2",
        "--config.model.n_heads=2", "--config.model.d_ff=64", "--config.nextlat.hidden=32"]


def test_sweep_rows_per_draft_length():
  c = nextlat_configs.get_config("nextlat_tiny")
  c.model.update(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64)
  c.nextlat.hidden = 32
  fam = registry.get_family(c)
  params = nn.unbox(fam.init(jax.random.PRNGKey(1)))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 40.0  # sharp: no near-ties
  prompts = [np.arange(1, 7, dtype=np.int32), np.arange(10, 16, dtype=np.int32)]
  rows = bench_decode.speculative_sweep(fam, params, prompts, new_tokens=10, draft_lens=[2, 5])
  assert [r["mode"] for r in rows] == ["plain", "speculative", "plain", "speculative", "sweep"]
  sweep = rows[-1]
  assert sweep["draft_lens"] == [2, 5] and sweep["greedy_match"] is True
  for point, spec in zip(sweep["points"], (rows[1], rows[3])):
    k = point["draft_len"]
    assert spec["setup"]["draft_len"] == k and spec["greedy_match"] is True
    assert 1.0 <= point["tokens_per_draft"] <= k + 1  # accepted drafts + the pending token
    assert point["tokens_per_draft"] == spec["mean_tokens_per_draft"] and point["speedup"] > 0


def test_cli_sweep_on_random_init(capsys):
  argv = [f"--config={ROOT}/configs/nextlat.py:nextlat_tiny", *TINY, "--draft_lens=2,3", "--prompt_len=6",
          "--new_tokens=6", "--batch=1"]
  assert bench_decode.main(argv) == 0
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
  assert [r["mode"] for r in rows] == ["plain", "speculative", "plain", "speculative", "sweep"]
  assert rows[-1]["draft_lens"] == [2, 3] and rows[-1]["setup"]["weights"].startswith("random")


@pytest.mark.parametrize("bad", ["2,x", "0", ","])
def test_bad_draft_lens(bad):
  with pytest.raises(ConfigError, match="draft_lens"):
    bench_decode._parse(["--config=configs/nextlat.py:nextlat_tiny", f"--draft_lens={bad}"])


def test_distinct_fraction_is_the_plain_outputs_and_sampling_runs():
  """`distinct_token_fraction` is computed from the plain outputs (a looping output scores low),
  and a sampled sweep runs with no greedy check to report."""
  from nsl import speculative

  c = nextlat_configs.get_config("nextlat_tiny")
  c.model.update(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64)
  c.nextlat.hidden = 32
  fam = registry.get_family(c)
  params = nn.unbox(fam.init(jax.random.PRNGKey(1)))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 40.0
  prompts = [np.arange(1, 7, dtype=np.int32), np.arange(10, 16, dtype=np.int32)]
  dec = speculative.Decoder(fam, params, draft_len=2)
  outs = [dec.generate(p, 10, jax.random.fold_in(jax.random.PRNGKey(0), i)) for i, p in enumerate(prompts)]
  want = np.mean([len(set(o.tolist())) / 10 for o in outs])
  result = speculative.measure(fam, params, prompts, 10, draft_len=2)
  assert abs(result["plain"]["distinct_token_fraction"] - want) < 1e-12
  rows = bench_decode.speculative_sweep(fam, params, prompts, 10, draft_lens=[2, 3], temperature=1.0)
  assert rows[-1]["greedy_match"] is None and rows[1]["setup"]["temperature"] == 1.0
  assert all(1.0 <= p["tokens_per_draft"] <= p["draft_len"] + 1 for p in rows[-1]["points"])


def test_negative_temperature_is_a_config_error():
  with pytest.raises(ConfigError, match="temperature"):
    bench_decode._parse(["--config=configs/nextlat.py:nextlat_tiny", "--temperature=-1"])
