"""Grid definitions -> cells (deterministic ids), the runner surviving a kill, backends, locks."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nsl.errors import ConfigError
from nsl.procs import alive
from nsl.scaling import cells as cell_files, grid
from nsl.scaling.backends import LocalBackend, TpuBackend, compile_cache_env
from nsl.scaling.locks import CellLock
from tests.helpers import ROOT, SUBPROCESS_XLA_FLAGS, make_corpus, run_cli

TINY_GRID = os.path.join(ROOT, "configs", "grids", "tiny.py")
LADDER_GRID = os.path.join(ROOT, "configs", "grids", "sps_ladder.py")


def write_grid(path: Path, body: str) -> str:
  path.write_text(textwrap.dedent(body))
  return str(path)


def test_tiny_grid_expansion_is_deterministic():
  cells = grid.expand(TINY_GRID)
  assert len(cells) == 18  # 2 families x 3 sizes x 3 compute levels
  assert len({c.run_id for c in cells}) == 18
  assert [c.run_id for c in grid.expand(TINY_GRID)] == [c.run_id for c in cells]
  assert {(c.family, c.variant) for c in cells} == {("standard", "standard"), ("sps", "sps")}
  assert {c.size for c in cells} == {"d32", "d48", "d64"}
  # IsoFLOP budgets: each width's steps spend the widest model's 16 / 32 / 64 steps of FLOPs
  steps = {size: sorted(c.steps for c in cells if c.size == size and c.family == "standard")
           for size in ("d32", "d48", "d64")}
  assert steps == {"d32": [54, 108, 215], "d48": [27, 53, 107], "d64": [16, 32, 64]}
  first = cells[0]
  assert first.run_id.startswith("standard-d32-55.3k-") and first.tokens == 54 * 16 * 64
  # relative to the code root: a worker runs its own copy of the code, not the runner's paths
  assert first.launch_args("/w")[:2] == ["--config=configs/tiny.py", "--workdir=/w"]
  assert ("train.steps", "54") in first.overrides and ("model.window", "none") in first.overrides


def test_run_ids_are_a_hash_of_the_effective_config(tmp_path):
  # pinned: changing the hash changes every existing grid root's directory names
  assert grid.config_hash({"b": [1, 2], "a": {"y": None, "x": 1.5}}) == "34283b08f8"
  # fields added later, at their neutral values, and logging/profiling leave the id alone
  base = {"seed": 0, "model": {"d_model": 32}, "data": {"path": "d"}, "train": {"steps": 5}}
  added = {"seed": 0, "init_seed": None, "evals": {}, "log": {"wandb": True},
           "model": {"d_model": 32, "cpu_kernels": True}, "data": {"path": "d", "mixture": ""},
           "train": {"steps": 5, "profile_steps": [2, 3]}}
  assert grid.config_hash(added) == grid.config_hash(base)
  for path, value in ((("init_seed",), 1), (("model", "cpu_kernels"), False), (("data", "mixture"), "a=1,b=1"),
                      (("evals",), {"x": {"kind": "nll"}})):
    changed = json.loads(json.dumps(added))
    (changed[path[0]] if len(path) == 2 else changed)[path[-1]] = value
    assert grid.config_hash(changed) != grid.config_hash(base), path
  a = write_grid(tmp_path / "a.py", """
      def get_grid():
        return {"base": "configs/tiny.py", "overrides": {"train.lr": 1e-3, "seed": 3},
                "axes": {"model.window": [None, 32], "train.steps": [200]}}
  """)
  # same cells from another spelling: other override order, a union, a dict axis value
  b = write_grid(tmp_path / "b.py", """
      def get_grid():
        fixed = {"seed": 3, "train.lr": 0.001}
        return [{"base": "configs/tiny.py", "overrides": fixed,
                 "axes": {"model.window": [None], "train.steps": [200]}},
                {"base": "configs/tiny.py", "overrides": fixed,
                 "axes": {"model.window": [None, {"_label": "w32", "model.window": 32}], "train.steps": [200]}}]
  """)
  ids_a, ids_b = [c.run_id for c in grid.expand(a)], [c.run_id for c in grid.expand(b)]
  assert len(ids_a) == len(ids_b) == 2  # the union is deduplicated
  assert [i.rsplit("-", 1)[1] for i in ids_a] == [i.rsplit("-", 1)[1] for i in ids_b]
  assert ids_a[1].startswith("window32-steps200-") and ids_b[1].startswith("w32-steps200-")
  # and in another process with another hash seed (the `list` CLI)
  out = run_cli("-m", "nsl.scaling.grid", "list", f"--grid={a}", "--json", env={"PYTHONHASHSEED": "123"})
  assert out.returncode == 0, out.stderr
  assert [json.loads(line)["run_id"] for line in out.stdout.splitlines()] == ids_a


def test_size_and_config_axes(tmp_path):
  g = write_grid(tmp_path / "g.py", """
      def get_grid():
        return {"axes": {"config": ["configs/tiny.py"], "size": ["xs", "s"], "tokens": [1e6]}}
  """)
  cells = grid.expand(g, validate=False)
  assert [c.size for c in cells] == ["xs", "s"]
  assert dict(cells[1].overrides)["model.d_model"] == "768"
  assert all(c.steps == round(1e6 / (32 * 128)) for c in cells)  # tiny.py: batch 32 x seq 128


def test_sps_ladder_has_the_papers_25_runs():
  subgrids = grid.load_grid_file(LADDER_GRID)
  assert len(grid.plan(subgrids)) == 25  # 5 sizes x 4 variants at 20B + 5 standard at 40B
  from nsl.models import registry
  configs = [a[1] for cell in grid.plan(subgrids) for a in cell if a[0] == "config"]
  assert "sps" in registry.FAMILIES
  assert all(os.path.isfile(os.path.join(ROOT, c.split(":")[0])) for c in configs), configs  # FILE.py:ARG
  cells = grid.expand(LADDER_GRID)
  assert len({c.run_id for c in cells}) == 25
  assert sorted({c.size for c in cells}) == ["l", "m", "s", "xl", "xs"]
  by = {(c.variant, c.steps) for c in cells}
  assert ("standard", 101725) in by and ("sps", 50863) in by and ("sps", 101725) not in by


def test_bad_grids_are_config_errors(tmp_path):
  with pytest.raises(ConfigError, match="no such grid file"):
    grid.expand(str(tmp_path / "missing.py"))
  bad = write_grid(tmp_path / "bad.py", """
      def get_grid():
        return {"base": "configs/tiny.py", "axes": {"model.nope": [1]}}
  """)
  with pytest.raises(ConfigError, match="unknown config key 'model.nope'"):
    grid.expand(bad)
  invalid = write_grid(tmp_path / "invalid.py", """
      def get_grid():
        return {"base": "configs/tiny.py", "axes": {"train.steps": [10]}}
  """)
  with pytest.raises(ConfigError, match=r"cell \{'train.steps': 'steps10'\}.*warmup_steps"):
    grid.expand(invalid)
  out = run_cli("-m", "nsl.scaling.grid", "list", f"--grid={tmp_path / 'missing.py'}")
  assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
  out = run_cli("-m", "nsl.scaling.grid", "frobnicate")
  assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1


def test_tpu_backend_builds_the_pod_script_command(tmp_path):
  cell = grid.expand(TINY_GRID)[0]
  script = tmp_path / "tpu_pod.sh"
  with pytest.raises(ConfigError, match="no such script"):
    TpuBackend(str(script))
  script.write_text("#!/bin/bash\n")
  argv = TpuBackend(str(script)).command(cell, "/runs/x")
  assert argv[:4] == ["bash", str(script), cell.config_path, "/runs/x"]
  assert argv[4:] == [f"--config.{k}={v}" for k, v in cell.overrides]
  assert LocalBackend().command(cell, "/runs/x")[1:3] == ["-m", "nsl.launch"]


def test_local_cells_share_the_grids_compile_cache_unless_the_user_chose_one(monkeypatch):
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  env = compile_cache_env("/runs/root/.jax_cache")
  assert env["JAX_COMPILATION_CACHE_DIR"] == "/runs/root/.jax_cache"
  assert int(env["JAX_COMPILATION_CACHE_MAX_SIZE"]) > 0  # sized, so JAX locks it between parallel cells
  assert compile_cache_env(None) == {} and TpuBackend().compile_cache is None
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")  # the user's choice (here: no cache) stands
  assert compile_cache_env("/runs/root/.jax_cache") == {}


def test_cell_lock_is_exclusive_and_stale_locks_are_taken_over(tmp_path):
  path = tmp_path / cell_files.LOCK_FILE
  lock = CellLock.acquire(path)
  assert lock is not None and CellLock.acquire(path) is None and CellLock.held(path)
  lock.release()
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  assert not alive(dead.pid)
  path.write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "start": None, "child_pid": None}))
  assert not CellLock.held(path)
  assert CellLock.acquire(path) is not None


# -- end to end -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_cell_grid(tmp_path_factory):
  d = tmp_path_factory.mktemp("grid")
  data = make_corpus(str(d))
  text = os.path.join(os.path.dirname(data), "text", "*.txt")
  return write_grid(d / "two.py", f"""
      def get_grid():
        return {{"base": "configs/tiny.py",
                "overrides": {{"data.path": {data!r}, "data.sources": ({text!r},), "data.tokenizer": "byte",
                              "data.val_fraction": 0.2, "model.vocab_size": 257, "model.d_model": 32,
                              "model.n_layers": 2, "model.n_heads": 2, "model.d_ff": 96, "data.seq_len": 64,
                              "train.batch_size": 8, "train.warmup_steps": 1, "train.decay_steps": 1,
                              "train.log_every": 1, "train.eval_every": 100, "train.eval_batches": 1,
                              "checkpoint.every": 2, "checkpoint.async_save": False}},
                "axes": {{"train.steps": [3, 4]}}}}
  """)


def _statuses(root: Path) -> dict:
  return {p.parent.name: json.loads(p.read_text()) for p in root.glob("*/status.json")}


def test_runner_killed_halfway_then_rerun_completes_without_redoing(two_cell_grid, tmp_path):
  root = tmp_path / "root"
  env = dict(os.environ, XLA_FLAGS=SUBPROCESS_XLA_FLAGS)  # single-device launchers
  cmd = [sys.executable, "-m", "nsl.scaling.grid", "run", f"--grid={two_cell_grid}", f"--root={root}",
         "--poll_seconds=0.2"]
  runner = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
  try:
    deadline = time.time() + 240
    while time.time() < deadline:
      st = _statuses(root)
      if any(s["status"] == "done" for s in st.values()):
        break
      assert runner.poll() is None, runner.stdout.read().decode()
      time.sleep(0.2)
    else:
      pytest.fail("no cell finished in time")
  finally:
    os.killpg(runner.pid, signal.SIGKILL)  # the runner and its launcher children
    runner.wait()
  st = _statuses(root)
  done = [k for k, s in st.items() if s["status"] == "done"]
  assert len(done) == 1
  metrics = root / done[0] / "metrics.jsonl"
  before = (metrics.stat().st_size, metrics.stat().st_mtime_ns)
  children = [pid for s in st.values() if s["status"] == "running" for pid in s["job"]["pids"]]
  for pid in children:  # the killed group leaves no trainer behind
    for _ in range(50):
      if not alive(pid):
        break
      time.sleep(0.1)
    assert not alive(pid)

  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
  assert out.returncode == 0, out.stdout + out.stderr
  ids = [c.run_id for c in grid.expand(two_cell_grid)]
  assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(ids)  # nothing duplicated
  st = _statuses(root)
  assert all(s["status"] == "done" for s in st.values())
  assert (metrics.stat().st_size, metrics.stat().st_mtime_ns) == before  # not retrained
  assert st[done[0]]["attempts"] == 1
  for run_id in ids:
    result = json.loads((root / run_id / "result.json").read_text())
    assert result["status"] == "done" and result["steps"] == int(run_id[5])
  assert "start" not in [line.split()[2] for line in out.stdout.splitlines() if done[0] in line]

  status = run_cli("-m", "nsl.scaling.grid", "status", f"--root={root}")
  assert status.returncode == 0 and status.stdout.count(" done ") == 2, status.stdout
  from nsl.scaling import fit, plot  # their CLIs' mains, in this process (no extra start-up)
  assert fit.main([f"--root={root}", "--bootstrap=0"]) == 0
  assert json.loads((root / "fits.json").read_text())["families"]["standard"]["approach3"]["status"] == "skipped"
  assert plot.main([f"--root={root}"]) == 0
  assert (root / "plots" / "loss_vs_tokens.png").is_file()


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(os.path.join(ROOT, "configs", "grids")) if n.endswith(".py")))
def test_every_shipped_grid_expands_to_valid_cells_with_unique_ids(name):
  """A grid the README points users at must expand (every cell's config validated) to distinct
  run ids: two cells sharing an id would share a workdir."""
  cells = grid.expand(os.path.join(ROOT, "configs", "grids", name))
  assert cells and len({c.run_id for c in cells}) == len(cells)


def test_status_shows_a_running_cells_progress_and_a_failed_cells_worker(tmp_path):
  running, failed = tmp_path / "a-1", tmp_path / "b-2"
  for d, steps in ((running, 100), (failed, 10)):
    d.mkdir()
    cell_files.write_json(str(d / cell_files.CELL_FILE), {"run_id": d.name, "family": "standard", "steps": steps})
  claim = CellLock.acquire(str(running / cell_files.LOCK_FILE))
  try:
    cell_files.update_status(str(running), status="running", attempts=1)
    rows = [{"step": 10, "loss": 3.0, "tokens": 10_000, "tokens_per_sec": 500.0},
            {"step": 20, "loss": 2.5, "tokens": 20_000, "tokens_per_sec": 1000.0}]
    (running / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (failed / "logs").mkdir()
    (failed / "logs" / "slurm-7-task0.log").write_text("step 3\nall fine\n")
    (failed / "logs" / "slurm-7-task1.log").write_text("step 3\nnsl: error: data dir gs://b/d is missing\n")
    cell_files.update_status(str(failed), status="failed", attempts=3)
    by_id = {r["run_id"]: r for r in cell_files.cell_rows(str(tmp_path), live=True)}
    # 80 steps left at 1,000 tokens a step and 1,000 tokens/s
    assert by_id["a-1"]["step"] == 20 and by_id["a-1"]["eta_s"] == pytest.approx(80.0)
    assert by_id["b-2"]["error"].startswith("[slurm-7-task1] ") and "is missing" in by_id["b-2"]["error"]
    table = grid.format_table(list(by_id.values()))
    assert "(step 20, loss 2.5000, 1 min left)" in table and "[slurm-7-task1]" in table
  finally:
    claim.release()
