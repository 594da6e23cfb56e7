"""`python tools/kill_resume.py`: SIGKILL a tiny training run at random moments, resume it, and check
that it ends in the same bits as an uninterrupted run (docs/guide/determinism.md).

The run is the issue #42 config: configs/tiny.py at d_model 64, 2 layers, 64-token rows, batch 8,
40 steps, an asynchronous checkpoint every 2 steps, on the byte-tokenized embedded corpus. One
uninterrupted reference run, then per trial a fresh run SIGKILLed (its whole process group) either
after a random step was logged or the moment an asynchronous save starts writing after a random
step (the save still unfinished after the kill, else the next save of the resumed run is tried),
and the same command again to the end. A trial passes when the resumed run's result.json
(its `state_sha256` digest of parameters and optimizer state included) and every metrics line equal
the reference's, timings aside. Before the trials the train step is lowered here and must call the
C++ CPU kernels (attention forward and backward, the head and its loss), so the check cannot
silently run XLA's paths instead.

  python tools/kill_resume.py --trials 10 --seed 1     # prints one line per trial, then N/10
Exit status: 0 every trial bit-identical, 1 some differed, 2 bad arguments.
"""

from __future__ import annotations

import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from nsl.errors import ArgumentParser, cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = {"model.d_model": 64, "model.n_layers": 2, "model.n_heads": 4, "model.d_ff": 192,
             "data.seq_len": 64, "train.batch_size": 8, "train.log_every": 1, "checkpoint.every": 2,
             "checkpoint.async_save": "true", "data.tokenizer": "byte"}
KERNEL_TARGETS = ("nsl_flash_cpu_fwd", "nsl_flash_cpu_bwd", "nsl_head_cpu")
TIMING = {"tokens_per_sec", "tflops_per_device", "mfu", "wall_time_sec", "cpu_time_sec"}


def _overrides(args) -> list[str]:
  # 40 steps: warmup 5, decay 10, an evaluation at step 20 and at the end
  fields = {**OVERRIDES, "train.steps": args.steps, "train.warmup_steps": max(1, args.steps // 8),
            "train.decay_steps": args.steps // 4, "train.eval_every": args.steps // 2, "data.path": args.data}
  return [f"--config.{k}={v}" for k, v in fields.items()]


def _check_kernels(args) -> None:
  """The train step of this config, lowered on this host's devices, calls the C++ kernels."""
  import jax

  from nsl import config as nsl_config
  from nsl.train import program

  overrides = nsl_config.split_overrides(_overrides(args))[0]
  config = nsl_config.load_config(os.path.join(ROOT, "configs", "tiny.py"), overrides)
  text = program.Program(config, jax.devices()).lower_train().as_text()
  missing = [t for t in KERNEL_TARGETS if t not in text]
  if missing:
    raise SystemExit(f"kill_resume: the train step does not call {missing} on this host (a CPU with the "
                     "kernels built is needed: python -m nsl.kernels.cpu_build)")
  print(f"kernels: the train step calls {', '.join(KERNEL_TARGETS)} ({len(jax.devices())} {jax.default_backend()} device)",
        flush=True)


def _launch(args, workdir: str) -> subprocess.Popen:
  cmd = [sys.executable, "-m", "nsl.launch", f"--config={os.path.join(ROOT, 'configs', 'tiny.py')}",
         f"--workdir={workdir}", "--quiet", *_overrides(args)]
  return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _finish(proc: subprocess.Popen, what: str) -> None:
  out = proc.communicate()[0].decode()
  if proc.returncode != 0:
    raise RuntimeError(f"{what} exited with {proc.returncode}:\n{out[-3000:]}")


def _train_steps(workdir: str) -> list[int]:
  """Steps of the complete training lines of metrics.jsonl so far."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = f.read().split("\n")[:-1]  # the last piece may be a line being written
  return [r["step"] for r in map(json.loads, lines) if "loss" in r]


def _in_flight(workdir: str) -> set[str]:
  return set(glob.glob(os.path.join(workdir, "checkpoints", "*tmp*")))  # Orbax's unfinished step dirs


def _checkpoints(workdir: str) -> list[int]:
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit()) if os.path.isdir(d) else []


def _wait_for(proc: subprocess.Popen, ready) -> bool:
  """Polls ready() every 5 ms until it holds (True) or the run ends (False)."""
  while not ready():
    if proc.poll() is not None:
      return False
    time.sleep(0.005)
  return True


def _kill_when(proc: subprocess.Popen, ready) -> bool:
  """SIGKILLs the run's process group once ready() holds; False if the run ended first."""
  if not _wait_for(proc, ready):
    return False
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  return True


def _kill_mid_save(args, workdir: str, proc: subprocess.Popen) -> str | None:
  """SIGKILLs the run the moment a save begins that was not in flight before (a kill's leftover
  is none), and returns that save's directory once, the process dead, it is still unfinished and
  its step is no finished checkpoint. A save that committed between the poll and the kill would
  make the trial a kill after a save, so it is tried again on the resumed run, at most 3 times.
  None when the run ends first."""
  for _ in range(3):
    left = _in_flight(workdir)
    if not _kill_when(proc, lambda: bool(_in_flight(workdir) - left)):
      return None
    cut = [d for d in sorted(_in_flight(workdir) - left)
           if int(os.path.basename(d).split(".")[0]) not in _checkpoints(workdir)]
    if cut:
      return os.path.basename(cut[0])
    print("  the save committed before the kill landed; killing the resumed run's next save", flush=True)
    proc = _launch(args, workdir)
  return None


def _outcome(workdir: str) -> tuple[dict, list[dict]]:
  """result.json and metrics.jsonl without their timing fields."""
  with open(os.path.join(workdir, "result.json")) as f:
    result = {k: v for k, v in json.load(f).items() if k not in TIMING}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f]
  return result, metrics


def _trial(args, rng: random.Random, i: int, reference) -> bool | None:
  workdir = os.path.join(args.out, f"trial_{i}")
  during_save = rng.random() < args.save_fraction
  step = rng.randint(1, args.steps - 3)
  proc = _launch(args, workdir)
  if during_save:  # after `step`, at the next save's first write, proven unfinished after the kill
    cut = _wait_for(proc, lambda: step in _train_steps(workdir)) and _kill_mid_save(args, workdir, proc)
    killed = bool(cut)
  else:
    killed = _kill_when(proc, lambda: step in _train_steps(workdir))
  if not killed:
    print(f"trial {i}: the run ended before the kill; not counted", flush=True)
    return None
  done, saved = max(_train_steps(workdir), default=0), _checkpoints(workdir)
  how = f"during an async save after step {done} (left unfinished: {cut})" if during_save else f"after step {done}"
  _finish(_launch(args, workdir), f"trial {i}'s resumed run")
  result, metrics = _outcome(workdir)
  same = (result, metrics) == reference
  detail = "bit-identical" if same else (
      f"DIFFERS: state {result.get('state_sha256')} vs {reference[0].get('state_sha256')}, "
      f"final loss {result.get('final_loss')!r} vs {reference[0].get('final_loss')!r}")
  print(f"trial {i}: SIGKILL {how}, resumed from step {saved[-1] if saved else 0}: {detail}", flush=True)
  return same


@cli_main
def main(argv: list[str] | None = None) -> int:
  parser = ArgumentParser(prog="python tools/kill_resume.py", description=__doc__.split("\n")[0])
  parser.add_argument("--trials", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0, help="seeds the kill moments (not the model)")
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--save_fraction", type=float, default=0.5, help="share of kills during an async save")
  parser.add_argument("--data", default=os.path.join(ROOT, "data", "sotu-byte"),
                      help="the byte-tokenized corpus (prepared there on first use)")
  parser.add_argument("--out", default=None, help="run directories (default: a temporary one, removed)")
  args = parser.parse_args(argv)
  if args.trials < 1 or args.steps < 8 or not 0 <= args.save_fraction <= 1:
    parser.error("--trials must be >= 1, --steps >= 8 and --save_fraction in [0, 1]")
  keep = args.out is not None
  args.out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="kill_resume_"))
  if keep and os.path.exists(args.out) and os.listdir(args.out):
    parser.error(f"--out={args.out} is not empty; pick a new directory")
  os.makedirs(args.out, exist_ok=True)
  try:
    _check_kernels(args)
    start = time.time()
    _finish(_launch(args, os.path.join(args.out, "reference")), "the reference run")
    reference = _outcome(os.path.join(args.out, "reference"))
    print(f"reference: {args.steps} steps in {time.time() - start:.0f} s, final loss "
          f"{reference[0]['final_loss']!r}, state {reference[0]['state_sha256']}", flush=True)
    rng = random.Random(args.seed)
    outcomes = [_trial(args, rng, i, reference) for i in range(1, args.trials + 1)]
  finally:
    if not keep:
      shutil.rmtree(args.out, ignore_errors=True)
  counted = [o for o in outcomes if o is not None]
  print(f"{sum(counted)}/{len(counted)} SIGKILL/resume trials bit-identical to the uninterrupted run", flush=True)
  return 0 if all(counted) and counted else 1


if __name__ == "__main__":
  raise SystemExit(main())
