"""`grid run --backend=slurm`: every grid cell one Slurm job (docs/guide/pods.md#slurm).

A cell of `hosts` processes is one batch job of ceil(hosts / --slurm_tasks_per_node) nodes whose
`srun` starts one task per process (one per node by default; a node's GPUs all belong to its
task). Each task fetches the runner's code (`nsl.scaling.code`: ROOT/.code/<hash>.tar.gz, the
only thing besides the cell's workdir that the runner and the nodes share, and that may be a
bucket) into node-local scratch (`$TMPDIR` or /tmp, nsl-code/<hash>), and runs the cell from there
with `--slurm_python` through `nsl.scaling.task`, so its log is
WORKDIR/logs/slurm-<job>-task<rank>.log (`-restart<n>` added after a requeue, which keeps the job
id). A multi-process cell's launcher gets
`--distributed=auto`: JAX reads the job's SLURM_* variables itself (the coordinator is the first
node, its port derived from the job id; CPU processes talk through gloo).

The job is submitted with `--requeue` (a preempted or failed node's job goes back to the queue as
the same cell attempt: `poll` keeps answering None while it is pending or running again, and the
launcher resumes from its checkpoint) and `--signal=TERM@N` (N = --slurm_signal_seconds before
the time limit the launcher gets SIGTERM, saves and exits "preempted"; the runner then submits
the cell again). Its state is read from Slurm's own records: `sacct` where the cluster keeps
accounting, else `scontrol show job` (jobs stay there MinJobAge seconds after they end), else the
jobcomp/filetxt file when the controller writes one this host can read. Stopping the runner
sends `scancel --signal=TERM` to the job's tasks (they checkpoint and exit; not `--full`: srun
answers a SIGTERM of its own by killing its tasks), cancels a job whose tasks have not started,
and a second stop `scancel`s. A runner that died leaves its jobs running; the next one adopts a
cell's live job (its name and `--comment`, the workdir) instead of submitting another. The batch
script goes to sbatch on stdin and sbatch's own output to the node's /tmp: nothing is written to
a shared file system. On a GPU node with one task, JAX_LOCAL_DEVICE_IDS gives it every GPU (JAX's
Slurm detection would give it the one numbered SLURM_LOCALID).

Why not submitit: it can express this job (nodes, tasks per node, srun), but it keeps the pickled
callable, its results and its logs in a folder that "needs to point to a directory shared through
the cluster" and polls only through `sacct`, whereas here the nodes share nothing with the runner
but object storage (a gs:// root) and a cluster may have no accounting (sacct then reports it
disabled, and submitit's state stays UNKNOWN). Its preemption path (USR2, pickle the callable,
`scontrol requeue` from inside the job) would also sit beside the launcher's own SIGTERM
checkpoint. What is left -- one sbatch script, three ways to read a job's state -- is this module.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any

from nsl import storage
from nsl.errors import ConfigError, NslError
from nsl.scaling import code
from nsl.scaling.runner import LOST  # the cell's node or job went away: rescheduled, not a failure

RUNNING = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING",
           "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
# Ends that Slurm may still undo by requeueing the job (--requeue): final only once they last.
MAYBE_REQUEUED = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
REQUEUE_GRACE_SECONDS = 60.0
COMMAND_TIMEOUT = 30.0


class SlurmJob:
  """A cell's job: what `describe` records, and what `poll` learned."""

  def __init__(self, job_id: str, run_id: str, workdir: str, nodes: int, tasks: int, code_uri: str):
    self.job_id, self.run_id, self.workdir = job_id, run_id, workdir
    self.nodes, self.tasks, self.code_uri = nodes, tasks, code_uri
    self.pid = None  # no local process: the runner's claim records none
    self.rc: int | None = None
    self.state = "PENDING"
    self.ending_since: float | None = None  # when a MAYBE_REQUEUED state was first seen


def _slurm(*argv: str, input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
  if shutil.which(argv[0]) is None:
    raise NslError(f"--backend=slurm: `{argv[0]}` is not on PATH (run the grid where Slurm's client commands are)")
  try:
    return subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env=env)
  except subprocess.TimeoutExpired:  # an overloaded controller: the caller reads it as "no answer"
    return subprocess.CompletedProcess(list(argv), 124, "", f"{argv[0]} timed out after {COMMAND_TIMEOUT:.0f} s")


def _one_line(proc: subprocess.CompletedProcess) -> str:
  return " ".join((proc.stderr or proc.stdout).split())[:300]


class SlurmBackend:
  """Each cell one Slurm job (module docstring)."""

  name = "slurm"
  shares_disk = False  # the grid's data is prepared into the root, where every node reads it

  def __init__(self, root: str, partition: str = "", account: str = "", time_limit: str = "",
               gpus_per_node: int = 0, tasks_per_node: int = 1, python: str | None = None,
               signal_seconds: int = 120, extra: tuple[str, ...] = (), compile_cache: str | None = None):
    if tasks_per_node < 1 or gpus_per_node < 0 or signal_seconds < 1:
      raise ConfigError(f"--slurm_tasks_per_node={tasks_per_node} must be >= 1, --slurm_gpus_per_node="
                        f"{gpus_per_node} >= 0 and --slurm_signal_seconds={signal_seconds} >= 1")
    self.root = storage.resolve(root)
    self.partition, self.account, self.time_limit = partition, account, time_limit
    self.gpus_per_node, self.tasks_per_node, self.signal_seconds = gpus_per_node, tasks_per_node, signal_seconds
    self.python = python or sys.executable
    self.extra = tuple(e.strip() for e in extra if e.strip())
    self.compile_cache = compile_cache
    self.code_uri: str | None = None
    self.jobs: dict[str, SlurmJob] = {}
    self._sacct: bool | None = None  # None: not tried yet; False: this cluster keeps no accounting
    self._jobcomp: str | None | bool = False  # False: not looked up yet

  @classmethod
  def add_arguments(cls, parser) -> None:
    add = parser.add_argument
    add("--slurm_partition", default="",
        help="slurm backend: the partition (sbatch --partition); default the cluster's")
    add("--slurm_account", default="", help="slurm backend: the account to charge (sbatch --account)")
    add("--slurm_time", default="", help="slurm backend: each job's time limit (sbatch --time, e.g. 24:00:00)")
    add("--slurm_gpus_per_node", type=int, default=0, help="slurm backend: GPUs per node (sbatch --gpus-per-node)")
    add("--slurm_tasks_per_node", type=int, default=1,
        help="slurm backend: a cell's processes per node (1: one per node, all its GPUs in it)")
    add("--slurm_python", default="", help="slurm backend: the Python with nsl's dependencies on the nodes "
        "(default: the runner's own, when the nodes see the same path)")
    add("--slurm_signal_seconds", type=int, default=120,
        help="slurm backend: SIGTERM (checkpoint and exit) this long before the time limit")
    add("--slurm_extra", action="append", default=[], metavar="OPTION",
        help="slurm backend: one more #SBATCH option, e.g. --slurm_extra=--exclusive (repeatable)")

  @classmethod
  def from_args(cls, args, root: str) -> "SlurmBackend":
    cache = None if storage.is_remote(root) else storage.join(storage.resolve(root), ".jax_cache")
    return cls(root, args.slurm_partition, args.slurm_account, args.slurm_time, args.slurm_gpus_per_node,
               args.slurm_tasks_per_node, args.slurm_python or None, args.slurm_signal_seconds,
               tuple(args.slurm_extra), cache)

  # -- the job ----------------------------------------------------------------------------------
  def layout(self, cell) -> tuple[int, int, int]:
    """(nodes, tasks, tasks per node) of a cell's job."""
    tasks = max(1, int(getattr(cell, "hosts", 1)))
    per_node = min(self.tasks_per_node, tasks)
    return math.ceil(tasks / per_node), tasks, per_node

  def program(self, cell, workdir: str) -> list[str]:
    """A task's launcher command (run from the code root); the Python is the job's own."""
    argv = ["-m", "nsl.launch", *cell.launch_args(workdir)]
    return argv + (["--distributed=auto"] if self.layout(cell)[1] > 1 else [])

  def command(self, cell, workdir: str) -> list[str]:
    return [self.python, *self.program(cell, workdir)]

  def task_script(self, cell, workdir: str, code_uri: str) -> str:
    """What each task runs (bash): the code into node-local scratch once per node, then the
    launcher through nsl.scaling.task with this task's log name."""
    py, digest = shlex.quote(self.python), code.code_hash(code_uri)
    program = " ".join(shlex.quote(a) for a in self.program(cell, workdir))
    return f"""set -euo pipefail
code_dir=${{TMPDIR:-/tmp}}/nsl-code/{digest}
if [ ! -d "$code_dir" ]; then  # unpacked aside, then renamed: a node's other tasks never see half of it
  mkdir -p "${{code_dir%/*}}"
  part=$(mktemp -d "$code_dir.part.XXXXXX")
  {py} -c {shlex.quote(code.FETCH_PY)} {shlex.quote(code_uri)} "$part"
  mv -T "$part" "$code_dir" 2>/dev/null || rm -rf "$part"
fi
cd "$code_dir"
name=slurm-$SLURM_JOB_ID-task$SLURM_PROCID
[ "${{SLURM_RESTART_COUNT:-0}}" = 0 ] || name=$name-restart$SLURM_RESTART_COUNT
quiet=; [ "$SLURM_PROCID" = 0 ] || quiet=--quiet
exec {py} -m nsl.scaling.task --workdir={shlex.quote(workdir)} --name="$name" -- {py} {program} $quiet
"""

  def batch_script(self, cell, workdir: str, code_uri: str) -> str:
    nodes, tasks, per_node = self.layout(cell)
    comment = f'"{workdir}"' if " " in workdir else workdir  # names the workdir: a new runner adopts the job
    options = [f"--job-name={job_name(cell)}", f"--comment={comment}", f"--nodes={nodes}", f"--ntasks={tasks}",
               f"--ntasks-per-node={per_node}", "--requeue", f"--signal=TERM@{self.signal_seconds}",
               "--output=/tmp/nsl-slurm-%j.out", "--open-mode=append", "--chdir=/tmp"]
    options += [f"--partition={self.partition}"] * bool(self.partition)
    options += [f"--account={self.account}"] * bool(self.account)
    options += [f"--time={self.time_limit}"] * bool(self.time_limit)
    options += [f"--gpus-per-node={self.gpus_per_node}"] * bool(self.gpus_per_node)
    env = ""
    if self.gpus_per_node and per_node == 1:  # JAX would give a Slurm task one GPU (SLURM_LOCALID)
      env = f"export JAX_LOCAL_DEVICE_IDS={','.join(map(str, range(self.gpus_per_node)))}\n"
    srun = (f"srun --kill-on-bad-exit=1 --nodes={nodes} --ntasks={tasks} --ntasks-per-node={per_node} "
            f"bash -c {shlex.quote(self.task_script(cell, workdir, code_uri))} nsl-task")
    return ("#!/bin/bash\n" + "".join(f"#SBATCH {o}\n" for o in options + list(self.extra))
            + f"# nsl grid cell {cell.run_id}: {workdir}\n{env}"
            # the tasks themselves answer SIGTERM (a checkpoint); the batch shell waits for them
            + "trap 'echo \"nsl: SIGTERM: the tasks checkpoint and exit\"' TERM\n"
            + f"{srun} &\npid=$!\n"
            + 'until wait "$pid"; rc=$?; ! kill -0 "$pid" 2>/dev/null; do :; done\nexit "$rc"\n')

  def start(self, cell, workdir: str, slot: int) -> SlurmJob:
    """Submits the cell's job, or adopts the one a runner that died left queued or running for
    this workdir (a second job would only wait for the first's lock)."""
    nodes, tasks, _ = self.layout(cell)
    job_id = self.live_job(cell, workdir)
    if job_id is None:
      if self.code_uri is None:
        self.code_uri = code.pack(self.root)
      # sbatch exports this environment to the job (STORAGE_EMULATOR_HOST, JAX's cache, ...)
      env = dict(os.environ, **_compile_cache_env(self.compile_cache))
      proc = _slurm("sbatch", "--parsable", input=self.batch_script(cell, workdir, self.code_uri), env=env)
      if proc.returncode != 0:
        error = ConfigError if "invalid" in _one_line(proc).lower() else NslError  # a partition, account, option
        raise error(f"sbatch refused cell {cell.run_id}: {_one_line(proc)}")
      job_id = proc.stdout.strip().split(";")[0]
    job = SlurmJob(job_id, cell.run_id, workdir, nodes, tasks, self.code_uri)
    self.jobs[job_id] = job
    return job

  def live_job(self, cell, workdir: str) -> str | None:
    """The id of a queued or running job of this cell (its name and `--comment` the workdir)."""
    proc = _slurm("squeue", "-h", "-n", job_name(cell), "-o", "%i|%k")
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
      job_id, _, comment = line.partition("|")
      if comment.strip() == workdir:
        return job_id.strip()
    return None

  # -- its state --------------------------------------------------------------------------------
  def poll(self, job: SlurmJob) -> int | None:
    if job.rc is not None:
      return job.rc
    found = self.job_state(job.job_id)
    if found is None:  # Slurm did not answer (busy controller): ask again next time
      return None
    state, exit_code = found
    job.state = state
    if state in RUNNING:
      job.ending_since = None
      return None
    if state in MAYBE_REQUEUED:
      job.ending_since = job.ending_since or time.time()
      if time.time() - job.ending_since < REQUEUE_GRACE_SECONDS:
        return None
    job.rc = exit_status(state, exit_code)
    self.jobs.pop(job.job_id, None)
    return job.rc

  def waiting(self, job: SlurmJob) -> str | None:
    """Why a cell's job is not running, when Slurm holds it: a held job (JobHeldAdmin,
    JobHeldUser) waits for `scontrol release`, however long, so the runner says so; None for a
    running job or one merely queued (Priority, Resources: it starts on its own)."""
    if job.state not in ("PENDING", "REQUEUE_HOLD") or job.rc is not None:
      return None
    proc = _slurm("scontrol", "show", "job", "-o", job.job_id)
    reason = _fields(proc.stdout).get("Reason", "") if proc.returncode == 0 else ""
    if not reason.startswith("JobHeld") and job.state != "REQUEUE_HOLD":
      return None
    return (f"Slurm job {job.job_id} is held ({reason or job.state}): it starts after "
            f"`scontrol release {job.job_id}`; `grid run` waits for it")

  def job_state(self, job_id: str) -> tuple[str, str] | None:
    """(state, "exit:signal") from sacct, else scontrol, else the jobcomp file; ("GONE", "") when
    none of them knows the job; None when Slurm could not be asked."""
    answered = True
    for read in (self._from_sacct, self._from_scontrol, self._from_jobcomp):
      found = read(job_id)
      if found:
        return found
      answered = answered and found is not None
    return ("GONE", "") if answered else None

  def _from_sacct(self, job_id: str) -> tuple[str, str] | bool:
    if self._sacct is False or shutil.which("sacct") is None:
      return False
    proc = _slurm("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,ExitCode")
    if proc.returncode != 0:  # "Slurm accounting storage is disabled": never ask again
      self._sacct = False if "disabled" in _one_line(proc) else self._sacct
      return False
    self._sacct = True
    for line in proc.stdout.splitlines():
      jid, state, exit_code = (line.split("|") + ["", "", ""])[:3]
      if jid == job_id:
        return state.split()[0] if state else "PENDING", exit_code
    return False  # not yet in the accounting database

  def _from_scontrol(self, job_id: str) -> tuple[str, str] | bool | None:
    proc = _slurm("scontrol", "show", "job", "-o", job_id)
    if proc.returncode != 0:
      return False if "invalid job id" in _one_line(proc).lower() else None
    fields = _fields(proc.stdout)
    return (fields["JobState"], fields.get("ExitCode", "")) if "JobState" in fields else None

  def _from_jobcomp(self, job_id: str) -> tuple[str, str] | bool:
    if self._jobcomp is False:
      lines = _slurm("scontrol", "show", "config").stdout.splitlines()
      config = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in lines)}
      path = config.get("JobCompLoc", "")
      self._jobcomp = path if config.get("JobCompType") == "jobcomp/filetxt" and os.path.isfile(path) else None
    if not self._jobcomp:
      return False
    last = None
    with open(self._jobcomp, errors="replace") as f:
      for line in f:
        if line.startswith(f"JobId={job_id} "):
          last = _fields(line)
    return (last["JobState"], last.get("ExitCode", "")) if last and "JobState" in last else False

  # -- stopping ---------------------------------------------------------------------------------
  def terminate(self, job: SlurmJob) -> None:
    """SIGTERM to every task (the launcher checkpoints and exits). Only to the tasks: srun itself
    answers SIGTERM by killing them ("forcing job termination"), so not `--full`. A job whose
    tasks have not started has nothing to save and is cancelled."""
    if job.rc is not None:
      return
    steps = _slurm("squeue", "-h", "-s", "-j", job.job_id, "-o", "%i")
    tasks = [s for s in steps.stdout.split() if not s.endswith((".batch", ".extern"))]
    if steps.returncode == 0 and not tasks:
      _slurm("scancel", job.job_id)
    else:
      _slurm("scancel", "--signal=TERM", job.job_id)

  def kill(self, job: SlurmJob) -> None:
    if job.rc is None:
      _slurm("scancel", job.job_id)

  def describe(self, job: SlurmJob) -> dict[str, Any]:
    return {"job_id": job.job_id, "nodes": job.nodes, "tasks": job.tasks, "partition": self.partition or None,
            "code": job.code_uri, "logs": storage.join(job.workdir, "logs", f"slurm-{job.job_id}-task*.log")}

  def close(self) -> None:
    """Cancels any job this runner started that has not ended (the runner crashed past its own
    cleanup): a cell left running would race its next attempt."""
    live = [j for j, job in self.jobs.items() if job.rc is None]
    if live:
      _slurm("scancel", *live)
    self.jobs.clear()


def job_name(cell) -> str:
  return f"nsl-{cell.run_id}"[:120]


def exit_status(state: str, exit_code: str) -> int:
  """The cell's exit status from a finished job's state and "exit:signal": the launcher's own
  status when the job completed or failed; LOST when its node or slot went away; else a failure
  (never 0, never 2, so the runner retries it from its checkpoint)."""
  code_part, _, sig_part = (exit_code or "0:0").partition(":")
  rc = int(code_part) if code_part.isdigit() else 0
  sig = int(sig_part) if sig_part.isdigit() else 0
  if state == "COMPLETED":
    return rc
  if state == "FAILED":
    return rc if rc else (128 + sig if sig else 1)
  if state in MAYBE_REQUEUED:
    return LOST
  if state == "CANCELLED":
    return 128 + (sig or 15)
  return 1 if rc in (0, 2) else rc  # TIMEOUT, OUT_OF_MEMORY, DEADLINE, GONE, ...


def _fields(text: str) -> dict[str, str]:
  """KEY=VALUE words of `scontrol show ... -o` and jobcomp/filetxt lines (values hold no spaces)."""
  out = {}
  for word in text.split():
    key, sep, value = word.partition("=")
    if sep and key not in out:
      out[key] = value
  return out


def _compile_cache_env(cache_dir: str | None) -> dict[str, str]:
  from nsl.scaling.backends import compile_cache_env

  return compile_cache_env(cache_dir)
