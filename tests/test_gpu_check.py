"""tools/gpu_check.sh --cpu-dry-run: the GPU check's every step (kernels against the dense
reference, the attention benchmark, train-step MFU) runs its real entry points on CPU at tiny
sizes in Pallas interpret mode, so the script is known to work up to the hardware. One rule keeps
it cheap (tests/kernels covers every rule)."""

import json
import os
import subprocess

from tests.helpers import ROOT


def test_cpu_dry_run_runs_every_step_and_writes_one_json_line_per_figure(tmp_path):
  out = tmp_path / "check.jsonl"
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # one CPU device, as on a GPU host's single chip
  proc = subprocess.run(["bash", os.path.join(ROOT, "tools", "gpu_check.sh"), "--cpu-dry-run", f"--out={out}",
                         "--rules=dd_self"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
  assert [json.loads(x) for x in proc.stdout.splitlines()] == lines  # stdout is the record
  by = {}
  for r in lines:
    by.setdefault(r["check"], []).append(r)
  assert by["environment"][0]["backend"] == "cpu" and by["environment"][0]["cudnn_available"] is False
  kernels = by["kernel"]
  # dd_self: float32 and bfloat16, alone and under shard_map, all in interpret mode
  assert {(k["dtype"], k["sharded"]) for k in kernels} == {(d, s) for d in ("float32", "bfloat16")
                                                           for s in (False, True)}
  assert all(k["ok"] and not k["compiled"] and set(k["errors"]) == {"out", "lse", "dq", "dk", "dv"}
             for k in kernels)
  assert by["kernels"][0]["ok"] and by["kernels"][0]["failures"] == 0
  bench = {r["rule"]: r for r in by["attention"] if "rule" in r}
  assert set(bench) == {"sps_stream_major", "causal"}
  for r in bench.values():  # dense masked is timed; the GPU paths say why not on CPU
    assert r["time_s"]["xla"] > 0 and "pallas_gpu" in r["not_timed"] and "cudnn" in r["not_timed"]
  assert "plain token layout" in bench["sps_stream_major"]["not_timed"]["cudnn"]  # refused before any device
  steps = {r["config"].split(":")[-1]: r for r in by["train_step"]}
  assert set(steps) == {"standard_xs", "sps_xs"}
  for r in steps.values():
    assert r["achieved_gflops"] > 0 and r["chip"] is None and r["mfu"] is None  # no published CPU peak
  final = by["gpu_check"][0]
  assert final["ok"] is True and final["dry_run"] is True and lines[-1] == final
