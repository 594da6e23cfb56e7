"""A grid's data, prepared once before any cell starts (docs/guide/pods.md#data).

Every cell's config names its corpus (`data.path`, `data.sources`, the tokenizer). Left to the
cells, each run's process 0 would prepare it onto its own worker's disk (hours of tokenizing for
FineWeb-Edu while the other hosts wait, then fail to find the manifest there). The runner instead
prepares each distinct corpus once, with `python -m nsl.data.prepare`, where every cell can read it:
  - a backend whose processes share the runner's disk (local): at the config's own path;
  - any other (Slurm, Ray, a pod): in the grid's root, ROOT/data/<name>, a bucket when the root is
    one; the cells are launched with `--config.data.path` pointing there (a placement, outside the
    cell's identity: the run ids and the bits trained do not change).
A `gs://` data.path is the user's prepared corpus: it is only checked to exist. A mixture's data
dirs are prepared beforehand by the user (docs/guide/data.md#mixtures) and left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable

from nsl import storage
from nsl.errors import ConfigError

MANIFEST = "manifest.json"


def code_path(config_path: str) -> str:
  """A cell's FILE[:ARG], relative to the code root, as a path from here."""
  from nsl.scaling.backends import CODE_ROOT
  return config_path if os.path.isabs(config_path) else os.path.join(CODE_ROOT, config_path)


def spec(config) -> tuple:
  """What makes two cells' corpora the same prepared directory."""
  d = config.data
  return (str(d.path), tuple(d.sources), str(d.tokenizer), int(d.tokenizer_vocab), str(d.gpt2_bpe or ""),
          float(d.val_fraction))


def prepare_argv(data_spec: tuple, out: str) -> list[str]:
  path, sources, tokenizer, vocab, gpt2_bpe, val_fraction = data_spec
  argv = [sys.executable, "-m", "nsl.data.prepare", f"--out={out}", f"--tokenizer={tokenizer}",
          f"--val_fraction={val_fraction!r}", *(f"--source={s}" for s in sources)]
  if tokenizer == "bpe":
    argv.append(f"--vocab_size={vocab}")
  if gpt2_bpe:
    argv.append(f"--gpt2_bpe={gpt2_bpe}")
  return argv


def placement(data_spec: tuple, root: str, shares_disk: bool) -> str:
  path = data_spec[0]
  if storage.is_remote(path):
    return path
  if shares_disk:
    return os.path.abspath(path)
  return storage.join(root, "data", storage.basename(path))


def prepare(cells, root: str, shares_disk: bool, say: Callable[[str], None]) -> tuple[dict, dict]:
  """Prepares every corpus `cells` read (see the module docstring); -> (run_id -> the overrides
  that place its data, run_id -> the one-line error of a corpus that cannot be prepared: those
  cells fail without starting, the others run)."""
  from nsl import config as nsl_config

  where: dict[tuple, str | ConfigError] = {}
  placed, failed = {}, {}
  for cell in cells:
    config = nsl_config.load_config(code_path(cell.config_path), list(cell.overrides))
    if config.data.mixture:
      continue
    data_spec = spec(config)
    if data_spec not in where:
      try:
        where[data_spec] = _ensure(data_spec, placement(data_spec, root, shares_disk), say)
      except ConfigError as e:
        say(str(e))
        where[data_spec] = e
    if isinstance(where[data_spec], ConfigError):
      failed[cell.run_id] = str(where[data_spec])
    elif where[data_spec] != data_spec[0]:
      placed[cell.run_id] = (("data.path", where[data_spec]),)
  return placed, failed


def _ensure(data_spec: tuple, out: str, say: Callable[[str], None]) -> str:
  if storage.is_remote(data_spec[0]):
    storage.check_bucket(out, "config.data.path")
    if not storage.isfile(storage.join(out, MANIFEST)):
      raise ConfigError(f"config.data.path={out} has no {MANIFEST}: prepare it first "
                        f"(python -m nsl.data.prepare --out={out} ...)")
    return out
  say(f"data: preparing {data_spec[0]} once for the grid at {out}")
  proc = subprocess.run(prepare_argv(data_spec, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  if proc.returncode != 0:
    last = [l for l in proc.stdout.splitlines() if l.strip()][-1:] or [f"exit {proc.returncode}"]
    raise ConfigError(f"preparing the grid's data {data_spec[0]} at {out} failed: {last[0]}")
  return out
