"""The three commands configs/grids/tiny.py documents (grid run, fit, plot), run as a user would:
no warning, no traceback, and every identifiability verdict they print is borne out by the intervals
and values in the record they wrote (docs/guide/scaling.md). 18 short training runs: minutes."""

import json
import shlex
from pathlib import Path

import pytest

from nsl.scaling import approaches as ap
from tests.helpers import ROOT, run_cli

GRID = Path(ROOT) / "configs" / "grids" / "tiny.py"


def documented_commands(root: Path) -> list[list[str]]:
  """The `python -m ...` lines of the grid file's docstring, with its root swapped for `root`."""
  import importlib.util

  spec = importlib.util.spec_from_file_location("tiny_grid", GRID)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  lines = [ln.strip() for ln in module.__doc__.splitlines() if ln.strip().startswith("python -m ")]
  return [shlex.split(ln.replace("runs/grid_tiny", str(root)))[1:] for ln in lines]  # drop "python"


def problems_in_record(res: dict, approach: int, min_loss: float) -> list[str]:
  """What the record's own numbers say is wrong, re-derived here from the documented thresholds."""
  ci, found = res.get("ci", {}), []
  if approach == 3:
    keys = ("E", "A", "B", "alpha", "beta")
    found += [k for k in keys if ci.get(k) and not (ci[k][0] > 0 and ci[k][1] / ci[k][0] <= ap.SPAN_MAX)]
    found += [k for k in ("alpha", "beta") if not ap.EXPONENT_BOUNDS[0] <= res[k] <= ap.EXPONENT_BOUNDS[1]]
    found += ["E"] if res["E"] < ap.E_FLOOR * min_loss else []
    found += [] if res["converged"] else ["converged"]
  else:
    found += [k for k in ("N_opt_exponent", "D_opt_exponent") if ci.get(k) and ci[k][1] - ci[k][0] > ap.EXPONENT_WIDTH_MAX]
    c = ci.get("N_opt_at_C_ref")
    found += ["N_opt_at_C_ref"] if c and not (c[0] > 0 and c[1] / c[0] <= ap.SPAN_MAX) else []
    found += ["slices"] if approach == 2 and res["n_slices_used"] < 3 else []
  boot = res["bootstrap"]
  found += ["dropped"] if boot["n_resamples"] and boot["n_dropped"] > ap.MAX_DROPPED * boot["n_resamples"] else []
  return found


@pytest.mark.slow
def test_the_documented_commands_run_clean_and_tell_the_truth(tmp_path, monkeypatch):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)  # the grid's own cache, as a user gets it
  root = tmp_path / "grid_tiny"
  commands = documented_commands(root)
  assert [c[1] for c in commands] == ["nsl.scaling.grid", "nsl.scaling.fit", "nsl.scaling.plot"]
  outputs = []
  for cmd in commands:
    proc = run_cli(*cmd, timeout=1500)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "Warning" not in text, text[-3000:]
    outputs.append(proc.stdout)
  fit_out = outputs[1]

  for result in root.glob("*/result.json"):  # every run records nats and bits per byte
    r = json.loads(result.read_text())
    assert r["status"] == "done" and r["val_bytes_per_token"] == 1.0  # byte-level data
    assert r["eval_bits_per_byte"]["val"] == pytest.approx(r["eval"]["val"] / 0.6931471805599453)
    assert r["flops"] == r["flops_per_token"] * r["tokens"]

  # a model's three budgets share one compiled train step: 2 families x 3 sizes
  assert len(list((root / ".jax_cache").glob("jit_train_step-*-cache"))) == 6

  report = json.loads((root / "fits.json").read_text())
  assert report["method"]["compute"] == "stored training FLOPs"
  for name, fam in report["families"].items():
    assert fam["n_points"] == 9
    min_loss = min(p[2] for p in fam["points"])
    for k in (1, 2, 3):
      res = fam[f"approach{k}"]
      if res["status"] != "fitted":
        assert res["identifiable"] is False and f"skipped: {res['reason']}" in fit_out
        continue
      found = problems_in_record(res, k, min_loss)
      assert res["identifiable"] is (not found), (name, k, res["reason"], found)
      printed = "identifiable" if not found else f"NOT IDENTIFIABLE: {res['reason']}"
      assert f"-> {printed}" in fit_out
    # nine points over 3 sizes and 3 budgets do not pin down five parameters
    assert fam["approach3"]["identifiable"] is False
  plots = {p.name for p in (root / "plots").glob("*.png")}
  assert {"loss_vs_compute.png", "isoflop.png", "optimal_vs_compute.png", "fitted_vs_observed.png"} <= plots
