"""Trains a model from a config and records the run, or describes the config without training.

`python -m nsl.launch --config=configs/X.py[:ARG] --workdir=DIR [--config.a.b=v]`, the front door.
Modes: `train` (default) trains and records the run; `describe` prints one JSON line with the
parameter counts, FLOPs per token and tokens per step from shapes only.
Multi-process: `--coordinator_address --num_processes --process_id` (or the environment
variables NSL_COORDINATOR_ADDRESS / NSL_NUM_PROCESSES / NSL_PROCESS_ID) start JAX's distributed
runtime; `--distributed=auto` lets JAX detect a Cloud TPU pod or SLURM cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from nsl import storage
from nsl.errors import ArgumentParser, ConfigError, cli_main


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[tuple[str, str]]]:
  parser = ArgumentParser(prog="python -m nsl.launch", description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True, help="config file with get_config(), or FILE.py:ARG (configs/sps.py:xl)")
  parser.add_argument("--workdir", help="run directory, local or gs://bucket/dir (required for training)")
  parser.add_argument("--mode", default="train", choices=("train", "describe"),
                      help="train, or describe: one JSON line of counts and FLOPs from shapes alone")
  parser.add_argument("--restore_from", default=None, help="initialise parameters from another run's workdir (local or gs://)")
  parser.add_argument("--distributed", default="off", choices=("off", "auto", "explicit"),
                      help="initialise jax.distributed (explicit is implied by --coordinator_address)")
  parser.add_argument("--coordinator_address", default=os.environ.get("NSL_COORDINATOR_ADDRESS"),
                      help="HOST:PORT of process 0 (or $NSL_COORDINATOR_ADDRESS)")
  parser.add_argument("--num_processes", type=int, default=_env_int("NSL_NUM_PROCESSES"),
                      help="number of processes (or $NSL_NUM_PROCESSES)")
  parser.add_argument("--process_id", type=int, default=_env_int("NSL_PROCESS_ID"),
                      help="this process's index (or $NSL_PROCESS_ID)")
  parser.add_argument("--quiet", action="store_true", help="no progress display")
  from nsl.config import split_overrides

  overrides, rest = split_overrides(argv)
  args = parser.parse_args(rest)
  return args, overrides


def _env_int(name: str) -> int | None:
  value = os.environ.get(name)
  try:
    return int(value) if value not in (None, "") else None
  except ValueError:
    raise ConfigError(f"${name}={value!r} must be an integer") from None


def check_workdir(workdir: str) -> str:
  """The absolute run directory, created if missing; ConfigError when it cannot be one."""
  if not workdir or not workdir.strip():
    raise ConfigError("--workdir is empty; pass the run directory, e.g. --workdir=runs/mine")
  if storage.is_remote(workdir):
    return check_remote_workdir(workdir)
  path = os.path.abspath(workdir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f"--workdir={workdir} is a file, not a directory; choose another --workdir")
  parent = path
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ConfigError(f"--workdir={workdir}: {parent} is a file, so the run directory cannot be made under "
                      "it; choose another --workdir")
  if os.path.isfile(os.path.join(path, "manifest.json")):
    raise ConfigError(f"--workdir={workdir} is a prepared data directory (it holds manifest.json); "
                      "choose a new directory for the run")
  if os.path.basename(path) == "checkpoints" and os.path.isfile(os.path.join(os.path.dirname(path), "config.json")):
    raise ConfigError(f"--workdir={workdir} is the checkpoints directory of a run; pass the run directory "
                      f"{os.path.dirname(path)} instead")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ConfigError(f"--workdir={workdir} cannot be created ({e.strerror}); choose a writable "
                      "--workdir") from None
  probe = os.path.join(path, f".nsl-write-test-{os.getpid()}")
  try:  # a real write: access() says yes to root on a read-only mount
    with open(probe, "w"):
      pass
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"--workdir={workdir} is not writable ({e.strerror}); fix its permissions or choose "
                      "another --workdir") from None
  return path


# What only a prefix that nsl wrote holds (nsl.launch; the grid runner's cell files; the worker
# logs of nsl.scaling.task, which start before the trainer); beside them a run may hold anything
# (its evaluations' outputs, nsl.report's loss_curve.png).
RUN_MARKS = {"config.json", "metrics.jsonl", "checkpoints", ".nsl.lock", "cell.json", "status.json", "logs"}


def check_remote_workdir(workdir: str) -> str:
  """`check_workdir` for gs://bucket/dir: the bucket is reachable, the prefix is a new or nsl run
  directory (not a data dir, not someone else's objects), and a probe object can be written."""
  path = storage.resolve(workdir)
  storage.check_bucket(path, "--workdir")
  if storage.scheme(path) not in storage.LOCK_SCHEMES:
    raise ConfigError(f"--workdir={workdir}: {storage.scheme(path)}:// has no create-only write, so nsl cannot "
                      "lock a workdir there; use a gs:// or local --workdir")
  names = set(storage.listdir(path))
  if "manifest.json" in names:
    raise ConfigError(f"--workdir={workdir} is a prepared data directory (it holds manifest.json); "
                      "choose a new directory for the run")
  if storage.basename(path) == "checkpoints" and storage.isfile(storage.join(storage.dirname(path), "config.json")):
    raise ConfigError(f"--workdir={workdir} is the checkpoints directory of a run; pass the run directory "
                      f"{storage.dirname(path)} instead")
  foreign = sorted(names) if names and not names & RUN_MARKS else []
  if foreign:
    raise ConfigError(f"--workdir={workdir} holds objects nsl did not write ({', '.join(foreign[:3])}"
                      f"{', ...' if len(foreign) > 3 else ''}); choose a new prefix for the run")
  _probe_write(path, f".nsl-write-test-{os.getpid()}", f"--workdir={workdir} is not writable",
               "check the credentials' permissions or choose another --workdir")
  return path


def _probe_write(path: str, name: str, what: str, fix: str) -> None:
  """Writes and removes one object under `path`: ConfigError `what (cause); fix` when it cannot."""
  probe = storage.join(path, name)
  try:
    storage.write_text(probe, "")
    storage.remove(probe)
  except Exception as e:
    raise ConfigError(f"{what} ({type(e).__name__}: {' '.join(str(e).split())[:120]}); {fix}") from None


def check_shared_workdir(workdir: str, process: int) -> None:
  """On a process other than 0: the workdir process 0 made is visible and writable here."""
  import socket

  path = storage.resolve(workdir)
  where = f"--workdir={workdir}: process {process} on {socket.gethostname()}"
  if not storage.isdir(path) and not storage.is_remote(path):
    raise ConfigError(f"{where} does not see the directory process 0 made; every host must see one workdir "
                      "(a gs:// bucket, or a filesystem all hosts mount at the same path)")
  _probe_write(path, f".nsl-write-test-{socket.gethostname()}-{os.getpid()}", f"{where} cannot write there",
               "every host needs write access to the workdir")


def check_restore_from(path: str) -> None:
  """A --restore_from in a bucket names a run with checkpoints, checked before the workdir is
  touched (a local one is checked where it is read, as before)."""
  storage.check_bucket(path, "--restore_from")
  directory = path if storage.basename(path) == "checkpoints" else storage.join(path, "checkpoints")
  if not storage.isdir(directory):
    raise ConfigError(f"--restore_from={path}: no checkpoints directory at {directory}; name a run's workdir")


def init_distributed(args) -> None:
  import jax

  if args.coordinator_address or args.distributed == "explicit":
    if not (args.coordinator_address and args.num_processes and args.process_id is not None):
      raise ConfigError("multi-process runs need --coordinator_address, --num_processes and --process_id "
                        "(or NSL_COORDINATOR_ADDRESS / NSL_NUM_PROCESSES / NSL_PROCESS_ID)")
    # CPU processes need a collectives implementation for cross-process all-reduces; setting it
    # is harmless on accelerators (it only affects the CPU client). It must precede any JAX call.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=args.coordinator_address, num_processes=args.num_processes,
                               process_id=args.process_id)
  elif args.distributed == "auto":
    # A CPU job detected from Slurm's variables needs gloo like an explicit one (the JAX versions
    # nsl allows differ in their default).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize()  # Cloud TPU pods and SLURM are detected by JAX itself


@cli_main
def main(argv: list[str] | None = None) -> int:
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  if args.mode != "train":
    return _main(args, overrides, [])
  early_sigterm = []
  try:  # a SIGTERM before the trainer installs its own handler still ends in a "preempted" record
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: early_sigterm.append(signum))
  except ValueError:  # not the main thread
    return _main(args, overrides, early_sigterm)
  try:
    return _main(args, overrides, early_sigterm)
  finally:
    signal.signal(signal.SIGTERM, previous)


def _main(args, overrides, early_sigterm: list) -> int:
  if args.mode == "train":
    init_distributed(args)  # before anything touches the XLA backend
  from nsl import config as nsl_config

  config = nsl_config.load_config(args.config, overrides)
  if args.mode == "describe":
    from nsl.train import loop
    nsl_config.validate(config)
    print(json.dumps(loop.describe(config), sort_keys=True))
    return 0
  if args.workdir is None:
    raise ConfigError("--workdir is required for --mode=train")
  import jax
  from nsl.train import loop
  loop.check_resume(config, args.workdir)  # a resume's changed family is named before that family's checks
  nsl_config.validate(config, jax.device_count(), jax.process_count())  # before anything is written
  nsl_config.check_fits_memory(config, jax.local_devices())
  if storage.is_remote(str(config.data.path or "")):
    from nsl.data import datadir  # a missing bucket or object is reported before the workdir is touched
    datadir.fetch(str(config.data.path))
  if args.restore_from and storage.is_remote(args.restore_from):
    check_restore_from(args.restore_from)
  if jax.process_index() == 0:
    check_workdir(args.workdir)
  if jax.process_count() > 1:  # every host, before step 1: one line, not a failed first checkpoint
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("nsl_workdir_checked")
    if jax.process_index() != 0:
      check_shared_workdir(args.workdir, jax.process_index())
  from nsl.train import loop

  trainer = loop.Trainer(config, args.workdir, restore_from=args.restore_from, progress=not args.quiet)
  if early_sigterm:
    trainer._preemption.requested = True
  result = trainer.run()
  summary = {k: result.get(k) for k in ("status", "steps", "tokens", "final_loss", "eval")}
  print(json.dumps(summary, sort_keys=True))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
