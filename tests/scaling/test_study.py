"""nsl.scaling.study: arms, seeds, paired gaps and where a gap closes, on synthetic grid roots."""

import json
import math
import os

import pytest

from nsl.scaling import study


def _cell(root, run_id, labels, curve, status="done", batch=2, seq=8, ood=None, bytes_per_token=None):
  d = os.path.join(root, run_id)
  os.makedirs(d)
  with open(os.path.join(d, "cell.json"), "w") as f:
    json.dump({"run_id": run_id, "labels": labels}, f)
  with open(os.path.join(d, "status.json"), "w") as f:
    json.dump({"status": status}, f)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump({"train": {"batch_size": batch}, "data": {"seq_len": seq}, "seed": 0}, f)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    for step, nll in curve:
      f.write(json.dumps({"step": step, "loss": nll + 0.1}) + "\n")
      f.write(json.dumps({"step": step, "eval_val_nll": nll}) + "\n")
  with open(os.path.join(d, "result.json"), "w") as f:
    bits = {"eval_bits_per_byte": {"val": curve[-1][1] / math.log(2) / bytes_per_token},
            "val_bytes_per_token": bytes_per_token, "val_byte_counts": {"bytes": 4000, "targets": 4000 / bytes_per_token,
                                                                        "tokens_read": 1000}} if bytes_per_token else {}
    json.dump({"eval": {"val": curve[-1][1], **({"ood": ood} if ood is not None else {})}, "params_total": 1000, "tokens": curve[-1][0] * batch * seq,
               "wall_time_sec": 1.0, **bits}, f)


def _study(tmp_path):
  root = str(tmp_path / "root")
  steps = [10, 20, 40, 80, 160, 320]
  for s, jitter in ((0, 0.0), (1, 0.02)):
    _cell(root, f"std{s}", {"seed": f"seed{s}", "arm": "standard", "size": "d8"},
          [(t, 5.0 - 0.5 * math.log(t) + jitter) for t in steps], ood=7.0 + jitter, bytes_per_token=2.0)
    # crosses the baseline between step 20 and 40
    _cell(root, f"sps{s}", {"seed": f"seed{s}", "arm": "sps", "size": "d8"},
          [(t, 5.0 - 0.5 * math.log(t) + jitter + g) for t, g in zip(steps, (0.3, 0.1, -0.05, -0.1, -0.1, -0.1))],
          ood=6.8 + 2 * jitter, bytes_per_token=4.0)
    # a gap closing linearly in log(tokens) that does not reach 0 in budget
    _cell(root, f"slow{s}", {"seed": f"seed{s}", "arm": "slow", "size": "d8"},
          [(t, 5.0 - 0.5 * math.log(t) + jitter + 0.4 - 0.05 * math.log2(t / 10)) for t in steps])
  _cell(root, "pending", {"seed": "seed2", "arm": "sps", "size": "d8"}, [(10, 9.0)], status="running")
  return root


def test_rows_gaps_and_crossings(tmp_path):
  cells, skipped = study.load_cells(_study(tmp_path))
  assert skipped == {"running": 1}
  rows = {r["labels"]["arm"]: r for r in study.summarise(cells, ("arm", "standard"))}
  std, sps, slow = rows["standard"], rows["sps"], rows["slow"]
  assert std["seeds"] == ["seed0", "seed1"] and "gap_mean" not in std
  assert std["nll_sd"] == pytest.approx(0.02 / math.sqrt(2))
  assert sps["gap_mean"] == pytest.approx(-0.1) and sps["gap_sd"] == pytest.approx(0.0, abs=1e-9)
  # tokens = step x batch 2 x seq 8
  assert sps["catch"] == {"kind": "observed", "tokens": 40 * 16}
  assert slow["catch"]["kind"] == "trend"
  # another evaluation set: per-arm mean/sd where every seed has it, paired Δ to the baseline
  assert sps["extra"]["ood"]["mean"] == pytest.approx(6.82) and sps["extra"]["ood"]["gap_mean"] == pytest.approx(-0.19)
  assert sps["extra"]["ood"]["gap_sd"] == pytest.approx(0.02 / math.sqrt(2)) and slow["extra"] == {}
  # bits per byte: each arm's own bytes per token (a larger vocabulary), the paired gap in bits/byte
  final = 5.0 - 0.5 * math.log(320)
  assert std["bpb_mean"] == pytest.approx((final + 0.01) / math.log(2) / 2.0)
  assert sps["bpb_gap_mean"] == pytest.approx((final + 0.01 - 0.1) / math.log(2) / 4.0 - (final + 0.01) / math.log(2) / 2.0)
  assert "bpb_mean" not in slow and (std["bytes_per_token"], std["val_bytes"]) == (2.0, 4000)
  # Δ = 0.4 - 0.05 log2(t/10) reaches 0 at t = 10 * 2^8 steps
  assert slow["catch"]["tokens"] == pytest.approx(10 * 2 ** 8 * 16, rel=1e-6)


def test_widening_gap_is_not_closing():
  assert study.crossing([(10, 0.1), (20, 0.2), (40, 0.3), (80, 0.4), (160, 0.5), (320, 0.6)])["kind"] == "not closing"
  flat = study.crossing([(10, 0.5), (20, 0.5), (40, 0.5), (80, 0.499), (160, 0.498), (320, 0.497)])
  assert flat["kind"] == "not closing within 100x the budget" and "tokens" not in flat


def test_cli_table_and_plot(tmp_path, capsys):
  root = _study(tmp_path)
  out = tmp_path / "s.png"
  assert study.main([f"--root={root}", f"--plot={out}", f"--json={tmp_path / 's.json'}"]) == 0
  text = capsys.readouterr().out
  assert "val bits/byte (Δ)" in text and "| 2.000 (4,000) |" in text
  assert "| sps | d8 |" in text and "observed 640" in text and "ood NLL (Δ)" in text and "left out: 1 running" in text
  assert out.stat().st_size > 0
  assert len(json.loads((tmp_path / "s.json").read_text())["rows"]) == 3


def test_cli_missing_root_exits_2(tmp_path, capsys):
  assert study.main([f"--root={tmp_path / 'nope'}"]) == 2
  assert "is not a directory" in capsys.readouterr().err
