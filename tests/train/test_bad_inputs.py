"""Bad inputs through the real CLIs: one line on stderr naming the field or file, exit status 2.

Most cases call the CLI entry points (`nsl.launch.main`, `nsl.data.prepare.main`, ...) in
process, the same function `python -m` runs; a few go through a real subprocess so the whole
path (argparse, imports, exit status) is covered too.
"""

import json
import os

import pytest

from nsl import launch
from nsl.data import datadir, prepare
from tests.helpers import ROOT, make_corpus, run_cli


def _cli(capsys, main, *argv):
  rc = main(list(argv))
  err = capsys.readouterr().err.strip().splitlines()
  err = [l for l in err if l.startswith("nsl:")]
  return rc, err


def _one_line(rc, lines, *needles):
  assert rc == 2, lines
  assert len(lines) == 1, lines
  for n in needles:
    assert n in lines[0], lines
  return lines[0]


@pytest.mark.parametrize("override,field", [
    ("train.lr=nan", "train.lr"),
    ("train.lr=inf", "train.lr"),
    ("train.lr=-1e-3", "train.lr"),
    ("train.clip_norm=-1", "train.clip_norm"),
    ("train.b1=1.5", "train.b1"),
    ("train.b2=-0.1", "train.b2"),
    ("train.eps=0", "train.eps"),
    ("train.weight_decay=nan", "train.weight_decay"),
    ("checkpoint.every=-2", "checkpoint.every"),
    ("checkpoint.every=0", "checkpoint.every"),
    ("checkpoint.keep=0", "checkpoint.keep"),
    ("train.max_nonfinite=0", "train.max_nonfinite"),
    ("mesh.shape=('a','b','c')", "mesh.shape"),
    ("mesh.shape=(-1,-1,1)", "mesh.shape"),
    ("model.vocab_size=68719476736", "model.vocab_size"),
    ("data.seq_len=10000000", "data.seq_len"),
    ("data.path=", "data.path"),
    ("data.verify=md5", "data.verify"),
    ("data.val_fraction=1.5", "data.val_fraction"),
    ("seed=-1", "seed"),
])
def test_bad_config_values_are_one_line(tmp_path, capsys, override, field):
  rc, lines = _cli(capsys, launch.main, "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}",
                   f"--config.{override}")
  _one_line(rc, lines, f"config.{field}")
  assert not (tmp_path / "run").exists()  # refused before anything is written


def test_impossible_sizes_are_refused_in_describe_too(capsys):
  for override in ("data.seq_len=10000000", "model.vocab_size=68719476736"):
    rc, lines = _cli(capsys, launch.main, "--config=configs/tiny.py", "--mode=describe", f"--config.{override}")
    _one_line(rc, lines, override.split("=")[0])


def test_a_config_that_cannot_fit_memory_names_the_figure(tmp_path, capsys):
  rc, lines = _cli(capsys, launch.main, "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}",
                   "--config.model.vocab_size=1000000000", "--config.model.d_model=4096", "--config.model.n_heads=32")
  _one_line(rc, lines, "GiB", "parameters + optimizer")


@pytest.mark.parametrize("body,needle", [
    ("def get_config():\n  raise RuntimeError('boom')\n", "get_config() raised RuntimeError: boom"),
    ("def get_config():\n  return None\n", "returned NoneType"),
    ("def get_config():\n  return {'family': 'standard'}\n", "returned dict"),
    ("x = (\n", "failed to load"),
    ("y = 1\n", "defines no get_config()"),
])
def test_broken_config_files(tmp_path, capsys, body, needle):
  cfg = tmp_path / "cfg.py"
  cfg.write_text(body)
  rc, lines = _cli(capsys, launch.main, f"--config={cfg}", "--mode=describe")
  _one_line(rc, lines, str(cfg), needle)


def test_unusable_workdirs(tmp_path, capsys):
  a_file = tmp_path / "file"
  a_file.write_text("x")
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  (data_dir / "manifest.json").write_text("{}")
  cases = [(str(a_file), "is a file"), (str(a_file / "run"), "is a file, so the run directory cannot be made"),
           ("/proc/nsl-run", "cannot be created"), ("/proc", "not writable"), ("", "--workdir is empty"),
           (str(data_dir), "prepared data directory")]
  for workdir, needle in cases:
    rc, lines = _cli(capsys, launch.main, "--config=configs/tiny.py", f"--workdir={workdir}")
    _one_line(rc, lines, "--workdir", needle)


def test_argparse_mistakes_are_one_line_with_a_usage_hint(capsys):
  for main, argv, needle in [
      (launch.main, ["--config=configs/tiny.py", "--mode=bogus"], "invalid choice: 'bogus'"),
      (launch.main, ["--mode=describe"], "required: --config"),
      (launch.main, ["--config=configs/tiny.py", "--bogus"], "unrecognized arguments: --bogus"),
      (prepare.main, ["--source=sotu", "--out=/tmp/x", "--tokenizer=wordpiece"], "invalid choice: 'wordpiece'"),
      (prepare.main, ["--source=sotu"], "required: --out"),
      (prepare.main, ["--source=sotu", "--out=/tmp/x", "--seed=abc"], "invalid int value"),
  ]:
    rc, lines = _cli(capsys, main, *argv)
    line = _one_line(rc, lines, needle, "usage: python -m nsl.")
    assert len(line) < 400


def test_argparse_mistakes_through_the_real_commands():
  from nsl.errors import EXIT_USER_ERROR
  for args in (["-m", "nsl.launch", "--config=configs/tiny.py", "--mode=bogus"],
               ["-m", "nsl.data.prepare", "--source=sotu"],
               ["-m", "nsl.evals.nll"],
               ["-m", "nsl.scaling.grid", "run", "--grid=configs/grids/tiny.py"]):
    out = run_cli(*args)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == EXIT_USER_ERROR and len(lines) == 1 and "usage:" in lines[0], (args, out.stderr)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
  return make_corpus(str(tmp_path_factory.mktemp("corpus")), n=4, chars=3000)


def _cfg_file(tmp_path, data_dir, **overrides):
  cfg = tmp_path / "cfg.py"
  cfg.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom tests.helpers import tiny_config\n"
                 f"def get_config():\n  return tiny_config({data_dir!r}, **{overrides!r})\n")
  return str(cfg)


@pytest.mark.parametrize("damage,needle", [
    (lambda m: m["splits"]["train"]["shards"][0].pop("bytes"), "lacks 'bytes'"),
    (lambda m: m["splits"]["train"].pop("shards"), "lacks 'shards'"),
    (lambda m: m["splits"].__setitem__("val", ["x"]), "is not an object"),
    (lambda m: m.__setitem__("dtype", "nope"), "dtype"),
])
def test_manifests_with_missing_keys(tmp_path, capsys, corpus_dir, damage, needle):
  import shutil
  data = tmp_path / "data"
  shutil.copytree(corpus_dir, data)
  manifest = json.loads((data / "manifest.json").read_text())
  damage(manifest)
  (data / "manifest.json").write_text(json.dumps(manifest))
  rc, lines = _cli(capsys, launch.main, f"--config={_cfg_file(tmp_path, str(data))}", f"--workdir={tmp_path / 'run'}")
  _one_line(rc, lines, "manifest.json", needle)


def test_disk_full_while_preparing_is_one_line(tmp_path, capsys, monkeypatch):
  import errno
  text = tmp_path / "a.txt"
  text.write_text("some text " * 100)

  def full(self):
    raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "train_00000.bin"))

  monkeypatch.setattr(datadir.ShardWriter, "_flush", full)
  rc, lines = _cli(capsys, prepare.main, f"--source={text}", f"--out={tmp_path / 'out'}")
  _one_line(rc, lines, "disk full", "bytes free")
  assert not (tmp_path / "out").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]


# -- a run's checkpoints used wrongly, through `python -m nsl.launch` (issue #56 item 8) ---------
# A subprocess: Python's own "Exception ignored" tracebacks of abandoned Orbax reads print at
# garbage collection and at exit, where an in-process call (and pytest's own hook) would hide them.
SHORT = {"train.steps": 3, "train.warmup_steps": 1, "train.decay_steps": 1, "train.eval_every": 3,
         "checkpoint.every": 3}


@pytest.fixture(scope="module")
def source_run(corpus_dir, tmp_path_factory):
  """A finished 3-step run of tests.helpers.tiny_config (d_model 32, the standard family)."""
  import jax

  from nsl.train import loop
  from tests.helpers import tiny_config
  workdir = str(tmp_path_factory.mktemp("runs") / "source")
  loop.Trainer(tiny_config(corpus_dir, **SHORT), workdir, progress=False, devices=jax.devices()[:1]).run()
  return workdir


def _launch_cli(tmp_path, corpus_dir, workdir, *flags, **overrides):
  cfg = _cfg_file(tmp_path, corpus_dir, **SHORT, **overrides)
  out = run_cli("-m", "nsl.launch", f"--config={cfg}", f"--workdir={workdir}", "--quiet", *flags)
  return out.returncode, out.stderr.strip().splitlines()  # every line, not only nsl's


def _files(directory):
  return sorted((os.path.relpath(os.path.join(d, f), directory), os.path.getmtime(os.path.join(d, f)))
                for d, _, fs in os.walk(directory) for f in fs) if os.path.isdir(directory) else []


def test_restore_from_a_run_of_another_architecture_names_the_field(tmp_path, corpus_dir, source_run):
  workdir = tmp_path / "new"
  rc, lines = _launch_cli(tmp_path, corpus_dir, workdir, f"--restore_from={source_run}", **{"model.d_model": 64})
  _one_line(rc, lines, f"--restore_from='{source_run}'", f"{source_run}/checkpoints/3 is of another architecture",
            "config.model.d_model is 32 there, 64 here", "[257, 32] there, [257, 64] here",
            "use a run of the same family and model sizes")
  assert _files(workdir) == []  # read before the trainer writes anything


def test_restore_from_a_run_with_damaged_arrays_is_one_line(tmp_path, corpus_dir, source_run):
  import glob
  import shutil
  source = str(tmp_path / "source")
  shutil.copytree(source_run, source)
  arrays = glob.glob(os.path.join(source, "checkpoints", "3", "state", "ocdbt.process_0", "d", "*"))
  with open(max(arrays, key=os.path.getsize), "r+b") as f:  # a copy cut short
    f.truncate(os.path.getsize(f.name) // 3)
  workdir = tmp_path / "new"
  rc, lines = _launch_cli(tmp_path, corpus_dir, workdir, f"--restore_from={source}")
  _one_line(rc, lines, f"every checkpoint in {source}/checkpoints is damaged (steps [3])",
            "start without --restore_from")
  assert _files(workdir) == []


def test_resuming_with_another_family_names_the_family_before_its_checks(tmp_path, corpus_dir, source_run):
  """The SPS family's own check of this config (its <predict> id must lie past the tokenizer's
  ids) would refuse it too, for a reason that is not the user's mistake: the family changed."""
  import shutil
  workdir = str(tmp_path / "run")
  shutil.copytree(source_run, workdir)
  before = _files(workdir)
  rc, lines = _launch_cli(tmp_path, corpus_dir, workdir, **{"family": "sps", "model.variant": "sps",
                                                            "model.window": 8})
  line = _one_line(rc, lines, "config.family='sps' differs from the checkpoint", f"{workdir}/checkpoints",
                   "('standard')", "model.variant", "use a new --workdir")
  assert "predict" not in line and "--restore_from" not in line, line  # other weights would not fit either
  assert _files(workdir) == before
