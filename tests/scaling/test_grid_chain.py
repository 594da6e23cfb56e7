"""Grid cells that chain: "@cell:LABELS" names an earlier cell's directory (a LIFT student and
its teacher run); the runner starts a cell only once the cells it names are done."""

import io
import json
import os
import textwrap
from pathlib import Path

import pytest

from nsl.errors import ConfigError
from nsl.scaling import grid
from nsl.scaling.backends import LocalBackend
from nsl.scaling.runner import Runner
from tests.helpers import SUBPROCESS_XLA_FLAGS, make_corpus


def _grid(path: Path, data: str, text: str, teacher_fields: dict, student_teacher: str = "@cell:s0-teacher") -> str:
  common = {"data.path": data, "data.sources": (text,), "data.tokenizer": "byte", "data.val_fraction": 0.2,
            "model.vocab_size": 257, "model.d_model": 32, "model.n_layers": 2, "model.n_heads": 2,
            "model.d_ff": 96, "data.seq_len": 32, "train.batch_size": 4, "train.warmup_steps": 1,
            "train.decay_steps": 1, "train.steps": 2, "train.log_every": 1, "train.eval_every": 100,
            "train.eval_batches": 1, "checkpoint.every": 2, "checkpoint.async_save": False}
  path.write_text(textwrap.dedent(f"""
      def get_grid():
        common = {common!r}
        return [
          {{"base": "configs/tiny.py", "overrides": common,
            "axes": {{"seed": [{{"_label": "s0", "seed": 0}}], "arm": [dict({{"_label": "teacher"}}, **{teacher_fields!r})]}}}},
          {{"base": "configs/lift.py:tiny", "overrides": dict(common, **{{"lift.top_k": 16}}),
            "axes": {{"seed": [{{"_label": "s0", "seed": 0}}],
                      "arm": [{{"_label": "student", "lift.teacher": {student_teacher!r}}}]}}}},
        ]
  """))
  return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  d = tmp_path_factory.mktemp("chain")
  data = make_corpus(str(d))
  return data, os.path.join(os.path.dirname(data), "text", "*.txt")


def test_a_cell_reference_is_the_earlier_cells_directory_and_its_id_follows_it(corpus, tmp_path):
  data, text = corpus
  a = grid.expand(_grid(tmp_path / "a.py", data, text, {"train.lr": 1e-3}))
  b = grid.expand(_grid(tmp_path / "b.py", data, text, {"train.lr": 2e-3}))
  teacher, student = a
  assert student.requires == (teacher.run_id,) and teacher.requires == ()
  assert dict(student.overrides)["lift.teacher"] == f"@cell:{teacher.run_id}"
  args = student.launch_args("/runs/root/" + student.run_id)
  assert f"--config.lift.teacher=/runs/root/{teacher.run_id}" in args
  # another teacher is another experiment for the student too; the root is not in the id
  assert b[0].run_id != teacher.run_id and b[1].run_id != student.run_id
  assert grid.expand(str(tmp_path / "a.py"))[1].run_id == student.run_id
  with pytest.raises(ConfigError, match="must name exactly one earlier cell.*s0-teacher"):
    grid.expand(_grid(tmp_path / "c.py", data, text, {}, student_teacher="@cell:s1-teacher"))


def _run(cells, root):
  out = io.StringIO()
  counts = Runner(cells, str(root), LocalBackend(), parallel=2, retries=0, poll_seconds=0.2, out=out).run()
  return counts, out.getvalue()


def test_runner_starts_a_student_after_its_teacher_and_fails_it_when_the_teacher_fails(corpus, tmp_path,
                                                                                       monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", SUBPROCESS_XLA_FLAGS)  # single-device launchers
  data, text = corpus
  teacher, student = grid.expand(_grid(tmp_path / "ok.py", data, text, {}))
  counts, log = _run([teacher, student], tmp_path / "root")  # parallel=2: the student still waits
  assert counts == {"done": 2}, log
  starts = [line.split()[3] for line in log.splitlines() if " start " in line]
  assert starts == [teacher.run_id, student.run_id]
  teacher_done = (tmp_path / "root" / teacher.run_id / "result.json").stat().st_mtime
  student_launched = (tmp_path / "root" / student.run_id / "config.json").stat().st_mtime  # its launcher's first write
  assert student_launched >= teacher_done
  status = json.loads((tmp_path / "root" / student.run_id / "status.json").read_text())
  assert f"--config.lift.teacher={tmp_path / 'root' / teacher.run_id}" in status["command"]

  # a teacher whose data cannot be prepared fails before it starts (the runner prepares a grid's
  # data once, before any cell: nsl.scaling.griddata), and its student fails without starting
  bad_t, bad_s = grid.expand(_grid(tmp_path / "bad.py", data, text, {"data.path": str(tmp_path / "none"),
                                                                         "data.sources": (str(tmp_path / "no" / "*.txt"),)}))
  counts, log = _run([bad_t, bad_s], tmp_path / "root2")
  assert counts == {"failed": 2}, log
  assert not any(" start " in line for line in log.splitlines()), log
  status = json.loads((tmp_path / "root2" / bad_t.run_id / "status.json").read_text())
  assert status["status"] == "failed" and "matches no files" in status["error"], status
  status = json.loads((tmp_path / "root2" / bad_s.run_id / "status.json").read_text())
  assert status["status"] == "failed" and bad_t.run_id in status["error"], status


def test_the_s5_grid_chains_each_student_to_its_own_seeds_teacher():
  from tests.helpers import ROOT

  cells = grid.expand(os.path.join(ROOT, "configs", "grids", "s5.py"))
  by_label = {c.run_id.rsplit("-", 1)[0]: c for c in cells}
  assert len(cells) == 18
  for seed in (0, 1, 2):
    s = f"seed{seed}"
    assert by_label[f"{s}-lift_s5"].requires == (by_label[f"{s}-lift_rnn_s5"].run_id,)
    assert by_label[f"{s}-lift_s5_bounded"].requires == (by_label[f"{s}-standard_s5_8x"].run_id,)
    assert by_label[f"{s}-standard_s5_8x"].steps == 8 * by_label[f"{s}-standard_s5"].steps
    assert not by_label[f"{s}-lift_s5_oracle"].requires


def test_the_lift_text_grid_feeds_every_student_the_one_4x_teacher():
  from tests.helpers import ROOT

  cells = {c.run_id.rsplit("-", 1)[0]: c for c in grid.expand(os.path.join(ROOT, "configs", "grids", "lift_text.py"))}
  teacher = cells.pop("seed0-teacher_4x")
  assert teacher.steps == 4 * cells["seed0-standard"].steps
  needs = {label: c.requires for label, c in cells.items()}
  assert needs == {f"seed{s}-{arm}": ((teacher.run_id,) if arm in ("lift", "distill") else ())
                   for s in (0, 1) for arm in ("standard", "lift", "lift_no_states", "distill")}
