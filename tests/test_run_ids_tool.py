"""tools/run_ids.py (docs/reference/grid_files.md#run-ids): every shipped config's and grid cell's
run id, and `--check` names each id that differs from a saved listing."""

import json

from tests.helpers import ROOT, run_cli


def test_the_tool_lists_every_shipped_id_and_check_names_a_moved_one(tmp_path):
  listed = run_cli(f"{ROOT}/tools/run_ids.py", timeout=300)
  assert listed.returncode == 0, listed.stderr[-2000:]
  ids = json.loads(listed.stdout)
  assert "configs/tiny.py" in ids and "configs/sps.py:sps_xl" in ids
  assert sum("configs/grids/tiny.py#" in k for k in ids) == 18  # the grid's cells, keyed by their labels
  before = tmp_path / "before.json"
  before.write_text(json.dumps(dict(ids, **{"configs/tiny.py": "0000000000"})))
  check = run_cli(f"{ROOT}/tools/run_ids.py", f"--check={before}", timeout=300)
  assert check.returncode == 1 and "configs/tiny.py: 0000000000 -> " in check.stdout, check.stdout[-2000:]
  assert json.loads(check.stdout.splitlines()[-1]) == {"compared": len(ids), "moved": 1}
