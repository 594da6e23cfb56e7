"""One process of a grid cell on a worker: runs the trainer and keeps its log beside the run
(docs/guide/pods.md#logs).

  python -m nsl.scaling.task --workdir=W --name=NAME -- PROGRAM ARGS...

Every backend (local, Slurm, Ray, the pod script) starts each of a cell's processes through this,
so a cell's logs live in its run directory whatever ran it: `W/logs/NAME.log`, written directly
for a local W, or kept in a local file and uploaded every `--upload_seconds` and at exit for a
`gs://` W, the only place a runner and a worker share. NAME names the worker ("slurm-812-task1",
"slice0-host1"), so a failed cell's error tail says where it came from.

The task ignores SIGINT (the runner turns Ctrl-C into SIGTERM), forwards SIGTERM to PROGRAM (the
launcher checkpoints and exits "preempted") and SIGKILLs it if it has not exited `--grace_seconds`
later, gets SIGTERM itself when its parent dies (Linux), and exits with PROGRAM's status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from nsl import storage
from nsl.errors import ArgumentParser, ConfigError, cli_main

LOGS = "logs"


def log_path(workdir: str, name: str) -> str:
  return storage.join(workdir, LOGS, f"{name}.log")


def _die_with_parent() -> None:
  if sys.platform.startswith("linux"):
    import ctypes
    try:
      ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
      pass


class _Uploader(threading.Thread):
  """Copies the local log to the bucket every `every` seconds while the program runs."""

  def __init__(self, local: str, remote: str, every: float):
    super().__init__(daemon=True)
    self.local, self.remote, self.every = local, remote, every
    self.stopped = threading.Event()

  def push(self) -> None:
    try:
      storage.upload(self.local, self.remote)
    except Exception as e:  # a slow or failing bucket must not stop training; the last push retries
      print(f"nsl.scaling.task: log upload to {self.remote} failed ({type(e).__name__})", file=sys.stderr)

  def run(self) -> None:
    while not self.stopped.wait(self.every):
      self.push()


def run(workdir: str, name: str, argv: list[str], upload_seconds: float = 15.0,
        grace_seconds: float = 300.0) -> int:
  remote = storage.is_remote(workdir)
  target = log_path(storage.resolve(workdir), name)
  if remote:
    local = os.path.join(storage.cache_dir("logs", storage.resolve(workdir)), f"{name}.log")
  else:
    local = target
  os.makedirs(os.path.dirname(local), exist_ok=True)
  with open(local, "ab") as log:
    log.write(f"[{time.strftime('%Y-%m-%dT%H:%M:%S')}] {name} on {os.uname().nodename}: {' '.join(argv)}\n"
              .encode())
    log.flush()
    try:
      proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except OSError as e:
      raise ConfigError(f"cannot start {argv[0]!r} ({e.strerror})") from None
  def forward(signum, frame):
    """SIGTERM to the trainer (it checkpoints and exits), SIGKILL if it has not after the grace:
    a save that needs a lost peer's collective would otherwise hang, orphaned."""
    if proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
      timer = threading.Timer(grace_seconds, lambda: proc.poll() is None and proc.kill())
      timer.daemon = True  # the task exits with its program, not when the timer would have fired
      timer.start()

  signal.signal(signal.SIGTERM, forward)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  uploader = _Uploader(local, target, upload_seconds) if remote else None
  if uploader:
    uploader.start()
  try:
    rc = proc.wait()
  finally:
    if proc.poll() is None:  # this process is being torn down: the trainer goes with it
      proc.kill()
    if uploader:
      uploader.stopped.set()
      uploader.push()
  return rc


@cli_main
def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  head, sep, program = (argv[:argv.index("--")], "--", argv[argv.index("--") + 1:]) if "--" in argv else (argv, "", [])
  p = ArgumentParser(prog="python -m nsl.scaling.task", description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", required=True, help="the cell's run directory (local or gs://)")
  p.add_argument("--name", required=True, help="this worker's name: its log is WORKDIR/logs/NAME.log")
  p.add_argument("--upload_seconds", type=float, default=15.0, help="how often a gs:// log is copied up")
  p.add_argument("--grace_seconds", type=float, default=300.0,
                 help="after SIGTERM, how long the program has to checkpoint and exit before SIGKILL")
  args = p.parse_args(head)
  if not sep or not program:
    raise ConfigError("nsl.scaling.task: give the program after --, e.g. -- python -m nsl.launch ...")
  _die_with_parent()
  return run(args.workdir, args.name, program, args.upload_seconds, args.grace_seconds)


if __name__ == "__main__":
  sys.exit(main())
