"""`grid plan` (nsl.scaling.plan): the tiny grid costed on v5e with libtpu's real compiler, one
compile per program, a cell that fits no slice named in one line with exit 2 (docs/guide/pods.md)."""

import json
import os
import re

import pytest

from tests.helpers import ROOT

pytest.importorskip("libtpu", reason="the [tpu] extra (libtpu) runs TPU compiles on any host")

from nsl.scaling import grid, plan  # noqa: E402

TINY_GRID = os.path.join(ROOT, "configs", "grids", "tiny.py")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """Compile attempts shared by this module's plans (each tiny program compiles once)."""
  return str(tmp_path_factory.mktemp("plan") / "plan.jsonl")


def test_tiny_grid_plan_on_v5e_compiles_each_program_once_and_totals_its_cells(capsys, cache):
  argv = ["plan", f"--grid={TINY_GRID}", "--generation=v5e", f"--cache={cache}"]
  cached = {row["key"] for row in plan._load(cache)}  # another test of the module may have run first
  assert grid.main(argv + ["--json"]) == 0
  out, err = capsys.readouterr()
  rows = [json.loads(line) for line in out.splitlines()]
  cells = grid.expand(TINY_GRID)
  assert [r["run_id"] for r in rows] == [c.run_id for c in cells]
  for r, c in zip(rows, cells):
    assert r["slice"] == "v5e-1" and r["chips"] == 1 and r["hosts"] == 1  # 35k-124k parameters
    assert r["step_seconds"] > 0 and r["steps"] == c.steps > 0 and r["chip_hours"] > 0
    assert r["chip_hours"] == pytest.approx(r["step_seconds"] * c.steps * r["chips"] / 3600)
  # 18 cells, 6 programs (2 families x 3 widths): budgets differ in train.steps and the schedule only
  compiles = [line for line in err.splitlines() if line.startswith("plan: compile")]
  programs = {r["program"] for r in rows}
  assert len(programs) == 6 and len(compiles) == len(programs - cached)
  # A rerun on the cache compiles nothing and prints the table whose total is the cells' sum.
  assert grid.main(argv) == 0
  out, err = capsys.readouterr()
  assert "plan: compile" not in err
  total = re.search(r"^total: 18 cells, ([\d.e+-]+) v5e chip-hours", out, re.M)
  assert total and float(total.group(1)) == pytest.approx(sum(r["chip_hours"] for r in rows), rel=1e-3)
  assert plan.smallest_slice(cells[0], "v5e", cache=cache) == "v5e-1"  # the Ray backend's default, from the cache


def test_cells_sharing_a_program_key_lower_to_the_same_train_step():
  """The cache's premise: two budgets of one model (steps, warmup, decay, LR differ) are one program."""
  from nsl import config as nsl_config
  from nsl import topology
  from nsl.train import program as program_lib

  sl = topology.get("v5e-1")
  path = os.path.join(ROOT, "configs", "tiny.py")
  a = nsl_config.load_config(path, [("model.n_layers", "1")])
  b = nsl_config.load_config(path, [("model.n_layers", "1"), ("train.steps", "77"), ("train.lr", "1e-4"),
                                    ("train.warmup_steps", "3"), ("train.decay_steps", "9")])
  c = nsl_config.load_config(path, [("model.n_layers", "1"), ("train.schedule", "cosine")])
  assert plan.program_key(a) == plan.program_key(b) != plan.program_key(c)
  lowered = [program_lib.Program(x, sl.devices).lower_train().as_text() for x in (a, b)]
  assert lowered[0] == lowered[1]


def test_a_cell_that_fits_no_slice_is_named_after_the_others_and_exits_2(tmp_path, capsys, cache):
  # The tiny grid's first cell, placed on a v5e-4 (costed there, not on the v5e-1 it would fit),
  # and a ~2.4B-parameter one.
  tiny = grid.load_grid_file(TINY_GRID)[0]
  small = {"base": os.path.join(ROOT, "configs", "tiny.py"), "overrides": {**tiny["overrides"], "slice": "v5e-4"},
           "axes": {k: [v[0]] for k, v in tiny["axes"].items()}}
  huge = {**small, "axes": {"size": [{"_label": "huge", "model.d_model": 4096, "model.n_heads": 32,
                                      "model.d_ff": 65536, "model.n_layers": 4}]}}
  grid_file = tmp_path / "big.py"
  grid_file.write_text(f"def get_grid():\n  return {[small, huge]!r}\n")
  rc = grid.main(["plan", f"--grid={grid_file}", "--generation=v5e", "--max_chips=4", f"--cache={cache}"])
  out, err = capsys.readouterr()
  assert rc == 2
  assert re.search(r"^standard-d32-[\w.-]+\s+v5e-4\s", out, re.M) and "total: 1 cells" in out
  error = err.strip().splitlines()[-1]
  huge = [c.run_id for c in grid.expand(str(grid_file)) if c.run_id.startswith("huge")][0]
  assert error.startswith("nsl: error: 1 cell(s) fit no v5e slice up to v5e-4: " + huge)
  assert "train state alone" in error  # 16 B x ~2.4B parameters, replicated by the data-parallel mesh


def test_a_gpu_generation_is_refused_in_one_line(capsys):
  assert grid.main(["plan", f"--grid={TINY_GRID}", "--generation=H100"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "TPU slices only" in err[0]
