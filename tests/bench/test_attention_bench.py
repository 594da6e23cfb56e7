"""`python -m nsl.bench.attention`: one JSON line per rule and length, and (with `--torch_python`)
torch's fused causal SDPA timed in rounds alternating with nsl's chunked path."""

import json
import os
import sys

import pytest

from nsl.bench import attention as bench_attention


def _rows(capsys):
  return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_rules_report_visibility_tiles_and_times(capsys):
  argv = ["--tokens=256", "--rules=causal,sps_stream_major", "--impls=chunked,xla", "--repeats=1"]
  assert bench_attention.main(argv) == 0
  causal, sps = _rows(capsys)
  assert (causal["rule"], causal["tokens"], sps["tokens"]) == ("causal", 256, 128)
  # 256 slots in 128-tiles: 3 of the 4 tiles are non-empty; the causal triangle of 256 is [256, 256]'s half
  assert (causal["tiles_visited"], causal["tiles_total"]) == (3, 4)
  assert causal["visible_fraction"] == pytest.approx((256 * 257 / 2) / 256 ** 2, abs=1e-5)
  for r in (causal, sps):
    assert set(r["time_s"]) == {"chunked", "xla"} and min(r["time_s"].values()) > 0
    assert r["chunked_over_xla"] == pytest.approx(r["time_s"]["chunked"] / r["time_s"]["xla"], abs=1e-3)
  assert "torch_sdpa_s" not in causal


def test_torch_python_that_does_not_exist_is_a_one_line_error(capsys):
  assert bench_attention.main(["--tokens=128", "--rules=causal", "--torch_python=/no/such/python"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "--torch_python='/no/such/python': no such executable" in err[0]


# A Python with torch for the side-by-side run: $NSL_TORCH_PYTHON, else this one (the [hf] extra, which
# `make test` installs, brings torch; without it the test fails, it does not skip).
TORCH_PYTHON = os.environ.get("NSL_TORCH_PYTHON") or sys.executable


def test_torch_python_without_torch_says_how_to_fix_it(tmp_path, capsys):
  """This very interpreter with its site-packages off (-S): a Python that cannot import torch,
  whatever the host's base Python has."""
  python = tmp_path / "python-without-site-packages"
  python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
  python.chmod(0o755)
  assert bench_attention.main(["--tokens=128", "--rules=causal", f"--torch_python={python}"]) == 2
  err = capsys.readouterr().err
  assert "cannot import torch" in err and "pip install torch" in err


def test_torch_python_needs_the_causal_chunked_float32_case(capsys):
  argv = ["--tokens=128", "--rules=window", f"--torch_python={sys.executable}"]
  assert bench_attention.main(argv) == 2
  assert "keep 'causal' in --rules" in capsys.readouterr().err


def test_against_torch_alternates_rounds(capsys):
  argv = ["--tokens=128", "--rules=causal", "--impls=chunked", "--repeats=1", "--rounds=2",
          f"--torch_python={TORCH_PYTHON}"]
  assert bench_attention.main(argv) == 0
  (row,) = _rows(capsys)
  assert len(row["chunked_s_by_round"]) == len(row["torch_sdpa_s_by_round"]) == 2
  ratios = [a / b for a, b in zip(row["chunked_s_by_round"], row["torch_sdpa_s_by_round"])]
  assert min(ratios) - 1e-3 <= row["chunked_over_torch_sdpa"] <= max(ratios) + 1e-3
  assert row["torch_threads"] == (os.cpu_count() or 1) and row["torch"]
