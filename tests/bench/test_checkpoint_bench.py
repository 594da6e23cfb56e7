"""nsl.bench.checkpoint: a real save timed, and a state costed from its shapes alone."""

import json

from tests.helpers import run_cli


def test_checkpoint_bench_times_a_real_save_and_costs_xl_from_its_bytes(tmp_path):
  out = run_cli("-m", "nsl.bench.checkpoint", "--config=configs/tiny.py", f"--dir={tmp_path / 'ckpt'}", "--repeats=2",
                "--bytes_for=configs/sps.py:xl", "--config.model.d_model=64", "--config.model.d_ff=192")
  assert out.returncode == 0, out.stderr
  rows = [json.loads(line) for line in out.stdout.splitlines()]
  saves, summary = rows[:-1], rows[-1]
  assert [r["save"] for r in saves] == [1, 2]
  assert all(0 < r["blocking_s"] <= r["total_s"] for r in saves)
  assert all(0 < r["fingerprint_s"] for r in saves) and summary["fingerprint_mb_per_s"] > 0
  meta = json.loads((tmp_path / "ckpt" / "2" / "meta" / "metadata").read_text())
  assert any(k.startswith("['params']") for k in meta["fingerprint"]) and "['step']" in meta["fingerprint"]
  assert (tmp_path / "ckpt" / "2").is_dir()  # a committed step, not a timing of nothing
  assert summary["other_bytes"] == 1_678_081_600 * 12  # XL's parameters and Adam moments, float32
  assert summary["other_total_s_at_this_rate"] > summary["best_total_s"]
