"""A grid cell that finished after its runner was SIGKILLed: the dead runner's lock is removed by
the next `run` (it would otherwise stay forever: done cells are never started again)."""

import json
import os
import subprocess
import sys

from nsl.scaling import cells as cell_files, grid
from nsl.scaling.backends import LocalBackend
from nsl.scaling.locks import CellLock
from nsl.scaling.runner import Runner
from tests.helpers import ROOT

TINY_GRID = os.path.join(ROOT, "configs", "grids", "tiny.py")


def test_dead_runners_lock_on_a_finished_cell_is_recovered(tmp_path):
  cells = grid.expand(TINY_GRID)[:2]
  root = tmp_path / "root"
  done, running = (root / c.run_id for c in cells)
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  for d in (done, running):
    d.mkdir(parents=True)
    (d / cell_files.LOCK_FILE).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "start": None,
                                                "child_pid": None, "child_start": None}))
    cell_files.update_status(d, run_id=d.name, status="running", attempts=1, failures=0)
  (done / "result.json").write_text(json.dumps({"status": "done", "eval": {"val": 1.0}}))
  runner = Runner(cells, str(root), LocalBackend(), out=open(os.devnull, "w"))
  runner._prepare()
  assert not (done / cell_files.LOCK_FILE).exists()
  assert json.loads((done / cell_files.STATUS_FILE).read_text())["status"] == "done"
  assert (running / cell_files.LOCK_FILE).exists() and not CellLock.held(running / cell_files.LOCK_FILE)  # taken over on start
  rows = {r["run_id"]: r for r in cell_files.cell_rows(root, [c.run_id for c in cells])}
  assert rows[done.name]["status"] == "done" and rows[running.name]["status"] == "stale"
