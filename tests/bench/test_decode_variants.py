"""`python -m nsl.bench.decode` on an SPS config: one JSON line per variant, the first call split
into its compile (per program) and the rest, and ratios against `standard` measured side by side."""

import json
import os

import pytest

from nsl.bench import decode as bench_decode

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--config.model.vocab_size=4160", "--config.model.d_model=32", "--config.model.n_layers=2",
        "--config.model.n_heads=2", "--config.model.d_ff=64"]


def test_variants_report_compile_and_ratios(capsys):
  argv = [f"--config={ROOT}/configs/sps.py:tiny", *TINY, "--variants=standard,sps", "--prompt_len=8",
          "--new_tokens=4", "--batch=2", "--repeats=1", "--window=4"]
  assert bench_decode.main(argv) == 0
  rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
  assert [r["variant"] for r in rows] == ["standard", "sps"]
  for r in rows:
    c = r["compile_s"]
    assert set(c) == {"prefill", "decode", "total"} and c["prefill"] > 0 and c["decode"] > 0
    assert abs(c["total"] - c["prefill"] - c["decode"]) < 2e-3 and c["total"] <= r["first_call_s"]
    assert r["decode_tokens_per_sec"] > 0 and r["prefill_tokens_per_sec"] > 0
  sps = rows[1]
  assert sps["window"] == 4 and sps["kv_cache_vs_standard"] > 1.0
  assert sps["decode_speed_vs_standard"] == sps["decode_tokens_per_sec"] / rows[0]["decode_tokens_per_sec"]


def _rows(capsys):
  return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_lift_rows_report_first_call_and_the_channel_cost(capsys):
  argv = [f"--config={ROOT}/configs/lift.py:lift_tiny", *TINY, "--prompt_len=6", "--new_tokens=3", "--batch=2",
          "--repeats=1"]
  assert bench_decode.main(argv) == 0
  rows = _rows(capsys)
  assert [r["variant"] for r in rows] == ["lift", "lift_no_states"]
  for r in rows:
    assert 0 < r["compile_s"] < r["first_call_s"] and r["seconds"] > 0
    assert r["positions_per_sec"] == 2 * 9 / r["seconds"] and r["new_tokens_per_sec"] == 2 * 3 / r["seconds"]
  assert rows[0]["vs_lift_no_states"] == rows[1]["seconds"] / rows[0]["seconds"]


def test_double_decoder_rows_report_first_call(capsys):
  argv = [f"--config={ROOT}/configs/dd.py:dd_tiny", *TINY, "--config.model.n_layers=3",
          "--config.model.mup_base_width=32", "--prompt_len=8",
          "--new_tokens=4", "--batch=2", "--repeats=1"]
  assert bench_decode.main(argv) == 0
  dd, do, ratio = _rows(capsys)
  assert (dd["model"], do["model"], ratio["model"]) == ("double_decoder", "decoder_only", "ratio_dd_over_decoder_only")
  for r in (dd, do):
    assert r["first_call_s"] > r["decode_s"] > 0 and r["first_call_s"] > r["prefill_s"] > 0
  assert dd["layers_cached"] == 1 and do["layers_cached"] == 3


@pytest.mark.parametrize("config,says", [("configs/dd.py:sed_tiny", "span-corruption encoder-decoder"),
                                         ("configs/nextlat.py:mtp_tiny", "standard trunk"),
                                         ("configs/nextlat.py:gpt_countdown", "needs a dynamics model")])
def test_a_config_with_nothing_to_time_is_one_line_and_status_2(config, says, capsys):
  assert bench_decode.main([f"--config={ROOT}/{config}", "--prompt_len=8", "--new_tokens=2"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("nsl: error:") and says in err[0], err
