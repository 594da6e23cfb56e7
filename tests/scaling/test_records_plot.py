"""Run records -> fit CLI -> fits.json -> plot CLI, on fake run directories written here."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nsl.errors import NslError
from nsl.scaling import fit, plot
from nsl.scaling.fit import Law
from nsl.scaling.records import load_runs

TRUE = Law(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)  # Epoch refit constants
REPO = Path(__file__).resolve().parents[2]


def write_run(root, run_id, family, N, D, loss, status="done", variant=None, window=None, flops_factor=1.0):
  d = root / run_id
  d.mkdir(parents=True)
  model = {"window": window, **({"variant": variant} if variant else {})}
  (d / "config.json").write_text(json.dumps({"family": family, "seed": 0, "model": model}))
  result = {"status": status, "family": family, "variant": variant, "params_total": N,
            "params_embedding": 0.1 * N, "params_non_embedding": 0.9 * N, "tokens": D,
            "flops": flops_factor * 6 * N * D, "flops_per_token": flops_factor * 6 * N,
            "eval": {"val": loss, "test": loss + 0.01}, "final_loss": loss}
  (d / "result.json").write_text(json.dumps(result))
  return d


@pytest.fixture(scope="module")
def grid_root(tmp_path_factory):
  """standard and sps (2x effective data, 2x FLOPs/token) over 4 sizes x 4 budgets, one nested
  level; a 3-run sps variant (too few to fit); a window ablation; a failed and a running run."""
  root = tmp_path_factory.mktemp("grid")
  rng = np.random.default_rng(0)
  i = 0
  for N in (3e7, 1e8, 3e8, 1e9):
    for ratio in (2.0, 8.0, 30.0, 120.0):
      D = ratio * N
      write_run(root, f"standard/{i:02d}", "standard", N, D, TRUE.loss(N, D) * np.exp(rng.normal(0, 0.002)))
      write_run(root, f"sps/{i:02d}", "sps", N, D, TRUE.loss(N, 2 * D) * np.exp(rng.normal(0, 0.002)),
                flops_factor=2.0)
      i += 1
  for k, N in enumerate((1e8, 2e8, 4e8)):
    write_run(root, f"delayed{k}", "sps", N, 20 * N, TRUE.loss(N, 20 * N), variant="sps_delayed")
  for w in (64, 256):
    write_run(root, f"window{w}", "standard", 1e8, 8e8, TRUE.loss(1e8, 8e8) * (1 + 2 / w), window=w)
  write_run(root, "failed", "standard", 1e8, 1e9, float("nan"), status="failed")
  write_run(root, "running", "standard", 1e8, 1e9, 3.0, status="running")
  return root


def test_load_runs_reads_done_runs_and_counts_the_rest(grid_root):
  runset = load_runs(grid_root)
  assert runset.skipped == {"status failed": 1, "status running": 1}
  groups = runset.by_label()
  assert sorted(groups) == ["sps", "sps_delayed", "standard"]
  assert len(groups["standard"]) == 18 and len(groups["sps"]) == 16 and len(groups["sps_delayed"]) == 3
  assert {r.window for r in groups["standard"]} == {None, 64, 256}
  assert any(r.run_id == "standard/00" for r in groups["standard"])
  with pytest.raises(NslError, match="has no split 'nope'"):
    load_runs(grid_root, loss_key="nope")


def test_malformed_or_incomplete_result_names_the_file(tmp_path):
  d = write_run(tmp_path, "bad", "standard", 1e8, 1e9, 3.0)
  (d / "result.json").write_text('{"status": "done", ')
  with pytest.raises(NslError, match=r"bad/result.json: malformed JSON"):
    load_runs(tmp_path)
  (d / "result.json").write_text(json.dumps({"status": "done", "family": "standard"}))
  with pytest.raises(NslError, match=r"bad/result.json: finished run lacks field"):
    load_runs(tmp_path)


def test_fit_then_plot_cli(grid_root, capsys):
  assert fit.main([f"--root={grid_root}", "--bootstrap=4"]) == 0
  report = json.loads((grid_root / "fits.json").read_text())
  assert report["method"]["compute"] == "stored training FLOPs"
  fams = report["families"]
  delayed = fams["sps_delayed"]["approach3"]
  assert delayed["status"] == "skipped" and delayed["identifiable"] is False
  assert "needs >= 5 points" in delayed["reason"]
  for name in ("standard", "sps"):
    a3 = fams[name]["approach3"]
    assert a3["status"] == "fitted" and a3["converged"]
    assert len(a3["bootstrap"]["samples_E_A_B_alpha_beta"]) == 4 - a3["bootstrap"]["n_dropped"]
    assert a3["N_opt_exponent"] == pytest.approx(a3["beta"] / (a3["alpha"] + a3["beta"]), rel=0.02)
    for k in (1, 2):
      assert fams[name][f"approach{k}"]["identifiable"] in (True, False, None)
  # sps spends 2x FLOPs per token in these records (its model is c N^p with c ≈ 12, p ≈ 1)
  c, p = fams["sps"]["flops_per_token_model"]
  assert c == pytest.approx(12.0, rel=1e-6) and p == pytest.approx(1.0, abs=1e-9)
  mult = report["multipliers"]
  assert mult["status"] == "ok" and mult["baseline"] == "standard"
  rows = mult["data"]["sps"]
  assert len(rows) == 16 and all(r["defined"] for r in rows)
  assert np.median([r["multiplier"] for r in rows]) == pytest.approx(2.0, rel=0.25)
  # 2x the data efficiency at 2x the FLOPs per token: in stored FLOPs the two cancel
  comp = [r["multiplier"] for r in mult["compute"]["sps"]]
  assert np.median(comp) == pytest.approx(1.0, rel=0.2)
  out = capsys.readouterr().out
  assert "sps vs standard" in out and "sps_delayed: 3 points" in out
  assert "compute = stored training FLOPs" in out

  assert plot.main([f"--root={grid_root}"]) == 0
  for name in ("loss_vs_compute", "loss_vs_tokens", "optimal_vs_compute", "fitted_vs_observed",
               "multipliers", "window_ablation"):
    for ext in ("png", "pdf"):
      path = grid_root / "plots" / f"{name}.{ext}"
      assert path.is_file() and path.stat().st_size > 1000, path
  assert "skipped isoflop" in capsys.readouterr().out  # a Cartesian grid has no compute slices


def test_empty_root_is_a_one_line_error(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "nsl.scaling.fit", f"--root={tmp_path}"], cwd=REPO,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.startswith("nsl: error:") and proc.stderr.count("\n") == 1, proc.stderr
  assert "no finished runs" in proc.stderr
  assert plot.main([f"--root={tmp_path}"]) == 2
  assert fit.main([f"--root={tmp_path / 'missing'}"]) == 2


def test_unknown_baseline_is_an_error(grid_root, capsys):
  assert fit.main([f"--root={grid_root}", "--baseline=stnadard", "--bootstrap=0"]) == 2
  assert "no point has that family" in capsys.readouterr().err
