"""A real one-node Slurm cluster on this host for the tests (issue #53: "the suite installs Debian's
slurm-wlm and munge and starts slurmctld and slurmd for one node on localhost").

`SlurmCluster().start()` installs `slurm-wlm munge` with apt-get when they are missing (as root;
otherwise `Unavailable` with a one-line reason the fixture turns into a skip), writes a minimal
slurm.conf for this host into a scratch directory, makes sure munged runs (a key of 1024 random
bytes if none exists), starts slurmctld and slurmd in the foreground as children of this process
and waits until the node is idle; `stop()` cancels what is left of its jobs and stops the daemons
it started. `env()` is what a client (sbatch, srun, scontrol, squeue) needs to reach it: SLURM_CONF.

What the configuration says, and why:
  - the node's CPUs are this host's; the partition oversubscribes them (OverSubscribe=FORCE:8),
    so two grid cells (or a cell's two tasks) run at once on a 2-core runner;
  - no cgroups (proctrack/linuxproc, task/none): the test host is a container;
  - no slurmdbd, so sacct says accounting is disabled: the job's state stays in `scontrol show
    job` for MinJobAge=300 s, and every finished job is also written to a jobcomp/filetxt file;
  - JobRequeue=1 (a batch job may be requeued) and ports of its own, so another cluster on the
    same host (a developer's) is not touched.
The fixture is `slurm` (session scope, import it into a test module).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged")
MUNGE_KEY = "/etc/munge/munge.key"


class Unavailable(Exception):
  """Slurm cannot be had here (the message says why, in one line): the tests skip. A cluster that
  is installed but does not come up is an error, not a skip."""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run(*argv: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
  return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)


def _sbin_on_path() -> None:
  """Debian puts the daemons in /usr/sbin, which a non-login PATH (CI's, `env -i`) may lack."""
  path = os.environ.get("PATH", "").split(os.pathsep)
  os.environ["PATH"] = os.pathsep.join(path + [d for d in ("/usr/local/sbin", "/usr/sbin", "/sbin") if d not in path])


def install() -> None:
  """apt-get install slurm-wlm munge when a daemon is missing; Unavailable where apt cannot."""
  _sbin_on_path()
  if all(shutil.which(d) for d in DAEMONS):
    return
  if os.geteuid() != 0:
    raise Unavailable("slurm-wlm/munge are not installed and installing them needs root")
  if not shutil.which("apt-get"):
    raise Unavailable("slurm-wlm/munge are not installed and there is no apt-get to install them")
  env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
  for argv, limit in ((("apt-get", "update", "-q"), 300),
                      (("apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES), 600)):
    proc = _run(*argv, timeout=limit, env=env)
    if proc.returncode != 0:
      last = (proc.stderr.strip().splitlines() or ["?"])[-1]
      raise Unavailable(f"`{' '.join(argv[:2])}` failed: {last}")
  missing = [d for d in DAEMONS if not shutil.which(d)]
  if missing:
    raise Unavailable(f"apt-get installed {' '.join(PACKAGES)} but {', '.join(missing)} is still missing")


def munge_running() -> bool:
  if not shutil.which("munge"):
    return False
  cred = _run("munge", "-n", timeout=10)
  return cred.returncode == 0 and _run("unmunge", input=cred.stdout, timeout=10).returncode == 0


def _memory_mb() -> int:
  with open("/proc/meminfo") as f:
    total_kb = int(next(line.split()[1] for line in f if line.startswith("MemTotal:")))
  return max(256, total_kb // 1024 // 2)  # below the host's, as slurmd requires


def slurm_conf(scratch: str, host: str) -> str:
  """A minimal slurm.conf for one node `host` with all state in `scratch`."""
  d = scratch
  return "\n".join([
      "ClusterName=nsltest", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
      "AuthType=auth/munge", "CredType=cred/munge",
      f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
      f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
      f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid",
      f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd.log",
      "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
      "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
      "JobRequeue=1", "MinJobAge=300", "KillWait=20",
      "JobCompType=jobcomp/filetxt", f"JobCompLoc={d}/jobcomp.txt",
      "SchedulerParameters=sched_interval=2", "SlurmctldTimeout=30", "SlurmdTimeout=60",
      f"NodeName={host} CPUs={os.cpu_count()} RealMemory={_memory_mb()} State=UNKNOWN",
      f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8",
      ""])


class SlurmCluster:
  """One slurmctld + slurmd for this host (module docstring)."""

  def __init__(self, scratch: str | None = None):
    self.scratch = scratch or tempfile.mkdtemp(prefix="nsl-slurm-")
    self.conf = os.path.join(self.scratch, "slurm.conf")
    self.host = socket.gethostname().split(".")[0]
    self.procs: dict[str, subprocess.Popen] = {}
    self.start_seconds: float | None = None

  def env(self) -> dict[str, str]:
    return {"SLURM_CONF": self.conf}

  def start(self, timeout: float = 60) -> "SlurmCluster":
    t0 = time.time()
    install()
    if os.geteuid() != 0:
      raise Unavailable("starting slurmd for a local node needs root")
    for sub in ("state", "spool"):
      os.makedirs(os.path.join(self.scratch, sub), exist_ok=True)
    with open(self.conf, "w") as f:
      f.write(slurm_conf(self.scratch, self.host))
    self._start_munge()
    env = dict(os.environ, **self.env())
    for name in ("slurmctld", "slurmd"):
      log = open(os.path.join(self.scratch, f"{name}.out"), "wb")
      self.procs[name] = subprocess.Popen([name, "-D", "-f", self.conf], stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=env, start_new_session=True)
      log.close()
    try:
      self._wait_idle(t0 + timeout)
    except BaseException:
      self.stop()
      raise
    self.start_seconds = time.time() - t0
    return self

  def _start_munge(self) -> None:
    if munge_running():
      return
    if not os.path.exists(MUNGE_KEY):
      os.makedirs(os.path.dirname(MUNGE_KEY), exist_ok=True)
      with open(MUNGE_KEY, "wb") as f:
        f.write(os.urandom(1024))
      shutil.chown(MUNGE_KEY, "munge", "munge")
      os.chmod(MUNGE_KEY, 0o400)
    for d in ("/run/munge", "/var/lib/munge", "/var/log/munge"):
      os.makedirs(d, exist_ok=True)
      shutil.chown(d, "munge", "munge")
    # munged daemonizes; --force: run although it is root and the socket dir is not its own
    proc = _run("munged", "--force", timeout=30)
    deadline = time.time() + 15
    while not munge_running():
      if time.time() > deadline:
        raise RuntimeError(f"munged did not start: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
      time.sleep(0.1)
    self.procs["munged"] = None  # started here: stopped in stop()

  def _wait_idle(self, deadline: float) -> None:
    env = dict(os.environ, **self.env())
    while True:
      for name, proc in self.procs.items():
        if proc is not None and proc.poll() is not None:
          raise RuntimeError(f"{name} exited with {proc.returncode} at start: {self._log_tail(name)}")
      out = _run("sinfo", "-h", "-n", self.host, "-o", "%t", env=env, timeout=10)
      if out.returncode == 0 and out.stdout.strip() == "idle":
        return
      if time.time() > deadline:
        said = out.stdout.strip() or out.stderr.strip()
        raise RuntimeError(f"node {self.host} not idle in time (sinfo: {said}; logs in {self.scratch})")
      time.sleep(0.2)

  def _log_tail(self, name: str) -> str:
    try:
      with open(os.path.join(self.scratch, f"{name}.log")) as f:
        return " | ".join(f.read().strip().splitlines()[-3:])
    except OSError:
      return "(no log)"

  def jobs(self) -> list[str]:
    """Ids of the jobs this cluster still holds (pending, running, completing)."""
    out = _run("squeue", "-h", "-o", "%i", env=dict(os.environ, **self.env()), timeout=10)
    return out.stdout.split()

  def stop(self) -> None:
    env = dict(os.environ, **self.env())
    if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
      left = self.jobs()
      if left:  # a failed test's jobs: their processes would outlive slurmd
        _run("scancel", *left, env=env, timeout=10)
    for name in ("slurmd", "slurmctld"):
      proc = self.procs.pop(name, None)
      if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
          proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
          proc.kill()
          proc.wait()
    if "munged" in self.procs:
      del self.procs["munged"]
      if _has_stop_flag():
        _run("munged", "--stop", timeout=20)
    shutil.rmtree(self.scratch, ignore_errors=True)


def _has_stop_flag() -> bool:
  return "--stop" in _run("munged", "--help", timeout=10).stdout


@pytest.fixture(scope="session")
def slurm():
  """The running cluster; SLURM_CONF in this process's environment meanwhile, so every client
  started by a test (and by the grid runner it starts) reaches it."""
  try:
    cluster = SlurmCluster().start()
  except Unavailable as e:
    pytest.skip(f"no Slurm: {e}")
  saved = os.environ.get("SLURM_CONF")
  os.environ.update(cluster.env())
  # what the jobs leave on the node: the unpacked code (nsl.scaling.slurm), sbatch's own output
  left = lambda: set(glob.glob(os.path.join(os.environ.get("TMPDIR", "/tmp"), "nsl-code", "*"))
                     + glob.glob("/tmp/nsl-slurm-*.out"))
  before = left()
  try:
    yield cluster
  finally:
    cluster.stop()
    os.environ.pop("SLURM_CONF", None) if saved is None else os.environ.__setitem__("SLURM_CONF", saved)
    for path in left() - before:
      shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
