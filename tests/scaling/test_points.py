"""Table input, exclusion rules, --out and the printed table of `python -m nsl.scaling.fit`."""

import json

import numpy as np
import pytest

from nsl.errors import NslError
from nsl.scaling import fit, points
from nsl.scaling.law import Law

TRUE = Law(E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)


def _rows(family="arch", data_scale=1.0, fpt=6.0):
  rng = np.random.default_rng(0)
  out = []
  for N in (1e7, 3e7, 1e8, 3e8):
    for ratio in (3.0, 10.0, 30.0, 100.0):
      D = ratio * N
      out.append({"N": N, "D": D, "loss": float(TRUE.loss(N, data_scale * D) * np.exp(rng.normal(0, 0.002))),
                  "family": family, "C": fpt * N * D})
  return out


def _csv(path, rows, fields):
  path.write_text(",".join(fields) + "\n" + "".join(",".join(str(r[f]) for f in fields) + "\n" for r in rows))
  return path


def test_csv_without_c_or_family_falls_back_to_6nd_and_says_so(tmp_path, capsys):
  table = _csv(tmp_path / "runs.csv", _rows(), ("N", "D", "loss"))
  out = tmp_path / "elsewhere" / "fit.json"
  assert fit.main([str(table), f"--out={out}", "--bootstrap=3"]) == 0
  printed = capsys.readouterr().out
  report = json.loads(out.read_text())
  assert report["method"]["compute"] == "6ND (the table has no C column)"
  assert "compute = 6ND (the table has no C column)" in printed
  assert list(report["families"]) == [points.DEFAULT_FAMILY]
  assert "baseline" not in printed  # no comparison asked for, one family: nothing about baselines
  assert report["families"]["all"]["approach3"]["status"] == "fitted"
  assert not (tmp_path / "fits.json").exists()


def test_jsonl_with_families_and_stored_compute(tmp_path, capsys):
  rows = _rows("base") + _rows("fast", data_scale=2.0, fpt=12.0)
  table = tmp_path / "runs.jsonl"
  table.write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert fit.main([str(table), "--bootstrap=0", "--baseline=base"]) == 0
  report = json.loads((tmp_path / "runs.jsonl.fits.json").read_text())
  assert report["method"]["compute"] == "stored training FLOPs (column C)"
  mult = report["multipliers"]
  assert mult["status"] == "ok" and mult["baseline"] == "base"
  assert np.median([r["multiplier"] for r in mult["data"]["fast"]]) == pytest.approx(2.0, rel=0.2)
  assert [r["N"] for r in mult["crossing"]["fast"]] == sorted({r["N"] for r in rows})  # one per size
  # read off base's own runs (no law): "fast" at (N, D) has base's loss at (N, 2D), so where base's
  # budgets bracket it the multiplier is near 2; at its largest budget it is beyond them
  observed = mult["observed"]["data"]["fast"]
  defined = [r["multiplier"] for r in observed if r["defined"]]
  assert len(defined) == 12 and np.median(defined) == pytest.approx(2.0, rel=0.1)
  assert all(r["bound"][0] == ">" for r in observed if not r["defined"])
  printed = capsys.readouterr().out
  assert "fast vs base" in printed and "identifiability not checked" in printed and "losses meet" in printed
  assert "read off base's runs at the same size (no law): fast D_eq/D" in printed and "at 12/16 points" in printed
  # half the tokens at twice the FLOPs a token: base's envelope reaches fast's losses at about the same compute
  compute = [r["multiplier"] for r in mult["observed"]["compute"]["fast"] if r["defined"]]
  assert len(compute) >= 8 and np.median(compute) == pytest.approx(1.0, rel=0.1)
  assert "read off base's envelope (no law): fast C_eq/C" in printed


def test_other_family_names_get_no_baseline_message(tmp_path, capsys):
  rows = _rows("a") + _rows("b", data_scale=2.0)
  _csv(tmp_path / "t.csv", rows, ("N", "D", "loss", "family"))
  assert fit.main([str(tmp_path / "t.csv"), "--bootstrap=0"]) == 0
  printed = capsys.readouterr().out
  assert "not found" not in printed
  assert "pass --baseline=FAMILY to compare families" in printed


def test_exclusion_rules(tmp_path, capsys):
  _csv(tmp_path / "t.csv", _rows(), ("N", "D", "loss"))
  assert fit.main([str(tmp_path / "t.csv"), "--bootstrap=0", "--exclude", "D/N<5", "--exclude=N >= 3e8"]) == 0
  report = json.loads((tmp_path / "t.csv.fits.json").read_text())
  assert report["input"]["excluded"] == {"D/N<5": 4, "N >= 3e8": 3}
  assert report["input"]["n_points"] == 9
  assert "excluded 4 by 'D/N<5'" in capsys.readouterr().out
  rule = points.parse_rule("family != sps")
  assert rule.matches(points.Point("x", "standard", 1.0, 1.0, 1.0, 6.0))


@pytest.mark.parametrize("rule,message", [
    ("D<<5", "'<5' is not a number"), ("Q<5", "expected FIELD OP VALUE"),
    ("D<ten", "'ten' is not a number"), ("family<sps", "compares only with == or !="),
])
def test_bad_rules_are_one_line_errors(tmp_path, rule, message):
  _csv(tmp_path / "t.csv", _rows(), ("N", "D", "loss"))
  with pytest.raises(NslError, match=message):
    points.load_points(tmp_path / "t.csv", exclude=[rule])


def test_table_errors_name_the_file_and_line(tmp_path):
  _csv(tmp_path / "a.csv", _rows(), ("N", "loss"))
  with pytest.raises(NslError, match=r"a.csv: no column D .*needs columns N, D, loss"):
    points.load_points(tmp_path / "a.csv")
  (tmp_path / "b.csv").write_text("N,D,loss\n1e6,1e7,2.5\n1e6,abc,2.4\n")
  with pytest.raises(NslError, match=r"b.csv:3: D='abc' is not a positive finite number"):
    points.load_points(tmp_path / "b.csv")
  (tmp_path / "c.txt").write_text("N,D,loss\n")
  with pytest.raises(NslError, match="must be a .csv"):
    points.load_points(tmp_path / "c.txt")
  _csv(tmp_path / "d.csv", _rows(), ("N", "D", "loss"))
  with pytest.raises(NslError, match="no rows to fit"):
    points.load_points(tmp_path / "d.csv", exclude=["N>0"])
  assert fit.main([str(tmp_path / "missing.csv")]) == 2
