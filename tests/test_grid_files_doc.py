"""docs/reference/grid_files.md's worked example is a grid file that expands as the page says:
the block is taken from the page, written to a file and expanded by `nsl.scaling.grid.expand`."""

import os
import re

from nsl.scaling import grid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "reference", "grid_files.md")


def _example() -> str:
  with open(PAGE, encoding="utf-8") as f:
    text = f.read()
  section = text.split("## A worked example", 1)
  assert len(section) == 2, "the page has a '## A worked example' section"
  block = re.search(r"```python\n(.*?)```", section[1], flags=re.DOTALL)
  assert block and "def get_grid" in block.group(1)
  return block.group(1)


def test_the_worked_example_expands_as_the_page_says(tmp_path):
  path = tmp_path / "example.py"
  path.write_text(_example())
  cells = grid.expand(str(path))
  ids = [c.run_id for c in cells]
  assert len(cells) == 18
  assert ids[0].startswith("seed0-standard-d64-400k-") and cells[0].steps == 195
  assert ids[15].startswith("seed1-sps-d128-800k-") and cells[15].variant == "sps"
  teacher, student = cells[16], cells[17]
  assert teacher.run_id.startswith("teacher-") and student.run_id.startswith("student-")
  assert student.requires == (teacher.run_id,)
  # the page quotes the listing's run ids: they are the expansion's
  with open(PAGE, encoding="utf-8") as f:
    text = f.read()
  for c in (cells[0], cells[15], teacher, student):
    assert c.run_id in text, (f"the page's listing lacks {c.run_id} (a default changed the config hash?): "
                              "paste the example's `python -m nsl.scaling.grid list` output into the page")
