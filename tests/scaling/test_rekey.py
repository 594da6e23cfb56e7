"""`grid rekey` (nsl/scaling/rekey.py, docs/reference/grid_files.md#run-ids): a finished cell
whose directory carries an older run id (the hash changed, the experiment did not) is moved to the
id the grid gives it now, so `grid run` finds it done instead of training it again; a directory of
the same labels but another experiment stays where it is."""

import json
import shutil

from tests.helpers import run_cli

OVERRIDES = {
    "data.path": "data/sotu-byte", "data.sources": ("sotu",), "data.tokenizer": "byte", "model.vocab_size": 257,
    "model.n_layers": 1, "model.d_model": 32, "model.n_heads": 2, "model.d_ff": 64, "data.seq_len": 32,
    "train.batch_size": 4, "train.steps": 6, "train.warmup_steps": 1, "train.decay_steps": 1,
    "train.eval_every": 1_000_000, "train.eval_batches": 1, "checkpoint.every": 6,
}


def _grid(tmp_path, *args):
  path = tmp_path / "one.py"
  path.write_text("def get_grid():\n  return " + repr({"base": "configs/tiny.py", "overrides": OVERRIDES,
                                                      "axes": {"seed": [0]}}) + "\n")
  return run_cli("-m", "nsl.scaling.grid", *args[:1], f"--grid={path}", *args[1:], timeout=600)


def test_a_cell_under_an_older_run_id_is_moved_and_found_done(tmp_path):
  root = tmp_path / "root"
  first = _grid(tmp_path, "run", f"--root={root}")
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  (run_id,) = [d.name for d in root.iterdir() if (d / "cell.json").is_file()]
  labels = run_id.rsplit("-", 1)[0]
  old, other = root / f"{labels}-1111111111", root / f"{labels}-0000000000"
  (root / run_id).rename(old)  # as an older nsl keyed it
  shutil.copytree(old, other)  # the same labels, another experiment
  config = json.loads((other / "config.json").read_text())
  config["train"]["lr"] = 0.5
  (other / "config.json").write_text(json.dumps(config))

  dry = _grid(tmp_path, "rekey", f"--root={root}", "--dry_run")
  assert dry.returncode == 0 and f"would move {old.name} -> {run_id}" in dry.stdout, dry.stdout + dry.stderr
  assert old.is_dir() and not (root / run_id).exists()
  moved = _grid(tmp_path, "rekey", f"--root={root}")
  assert f"moved {old.name} -> {run_id}" in moved.stdout, moved.stdout + moved.stderr
  assert f"left {other.name}: not {run_id} (train.lr differs)" in moved.stdout, moved.stdout
  assert json.loads((root / run_id / "cell.json").read_text())["run_id"] == run_id and other.is_dir()

  steps_before = (root / run_id / "metrics.jsonl").read_text()
  again = _grid(tmp_path, "run", f"--root={root}")
  assert again.returncode == 0 and "1 cells, 1 done, 0 to run" in again.stdout + again.stderr, again.stdout[-2000:]
  assert (root / run_id / "metrics.jsonl").read_text() == steps_before  # found done, not trained again
