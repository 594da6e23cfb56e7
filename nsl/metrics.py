"""The record format (docs/reference/records.md): metrics.jsonl, TensorBoard events, config.json,
result.json; the progress display; FLOPs, TFLOP/s per device and MFU accounting."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

import jax

# Dense bf16 peak FLOP/s per chip (vendor datasheets), for MFU. Keys are matched against
# `device.device_kind` lower-cased.
PEAK_BF16_FLOPS: dict[str, float] = {
    "tpu v4": 275e12,
    "tpu v5 lite": 197e12,  # v5e
    "tpu v5e": 197e12,
    "tpu v5p": 459e12,
    "tpu v5": 459e12,
    "tpu v6 lite": 918e12,  # v6e (Trillium)
    "tpu v6e": 918e12,
    "a100": 312e12,
    "h100": 989e12,
    "h200": 989e12,
}


def peak_flops_per_device(device=None) -> float | None:
  """The device's dense bf16 peak, or None where unknown (CPU): MFU is then not reported."""
  device = device or jax.devices()[0]
  kind = getattr(device, "device_kind", "").lower()
  for name in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
    if name in kind:
      return PEAK_BF16_FLOPS[name]
  return None


def write_json(path: str, obj: Any) -> None:
  """Atomic JSON write: readers (the grid runner) never see a half-written file. Always valid
  JSON: a non-finite float (a NaN loss) is written as null. A gs:// path is one object, replaced
  whole (nsl.storage)."""
  from nsl import storage

  if storage.is_remote(path):
    storage.write_text(path, json.dumps(finite_json(obj), indent=2, sort_keys=True, allow_nan=False) + "\n")
    return
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "w") as f:
      json.dump(finite_json(obj), f, indent=2, sort_keys=True, allow_nan=False)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise


def finite_json(obj: Any) -> Any:
  """`obj` with numpy/jax scalars made Python and non-finite floats replaced by None."""
  if isinstance(obj, dict):
    return {str(k): finite_json(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [finite_json(v) for v in obj]
  if isinstance(obj, float):
    return obj if math.isfinite(obj) else None
  if isinstance(obj, (str, int, bool)) or obj is None:
    return obj
  return finite_json(_jsonable(obj))


def _jsonable(x):
  if hasattr(x, "item"):
    return x.item()
  if hasattr(x, "tolist"):
    return x.tolist()
  return str(x)


class MetricsWriter:
  """Appends one JSON object per logged step to metrics.jsonl and mirrors scalars to TensorBoard
  and to any `sinks` (objects with `log(step, scalars)` and `close()`: W&B,
  `nsl.train.observe.WandbSink`). Only process 0 writes."""

  def __init__(self, workdir: str, enabled: bool = True, resume_step: int | None = None, sinks=()):
    """`resume_step`: the step the run continues from; lines after it (steps the run will replay)
    and a partial last line (a write cut by a kill) are dropped first."""
    self.enabled = enabled
    self._tb = None
    self._sinks = list(sinks) if enabled else []
    self._failed = False
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "metrics.jsonl")
    if resume_step is not None:
      truncate_records(path, resume_step)
    self._file = open(path, "a", buffering=1)
    try:
      self._tb = _summary_writer(os.path.join(workdir, "tb"))
    except ImportError:  # TensorBoard is optional; metrics.jsonl is the record
      self._tb = None

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step)}
    record.update({k: _scalar(v) for k, v in metrics.items()})
    try:
      self._file.write(json.dumps(record, sort_keys=True) + "\n")
    except OSError:
      self._failed = True  # e.g. a full disk: reported by the caller; close() must not mask it
      raise
    scalars = {k: v for k, v in record.items()
               if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    if self._tb is not None:
      for k, v in scalars.items():
        self._tb.add_scalar(k, v, step)
    for sink in self._sinks:
      sink.log(int(step), scalars)

  def close(self) -> None:
    if self.enabled:
      try:
        self._file.close()
      except OSError:
        if not self._failed:
          raise
      if self._tb is not None:
        self._tb.close()
      for sink in self._sinks:
        sink.close()


def _summary_writer(logdir: str):
  """tensorboardX's SummaryWriter, imported without torch: tensorboardX imports torch when it is
  installed (the [hf] extra) only to accept torch tensors, which costs every run ~5 s of start-up;
  nsl logs Python floats."""
  import sys

  block = "torch" not in sys.modules
  if block:
    sys.modules["torch"] = None  # makes `import torch` raise ImportError, which tensorboardX handles
  try:
    from tensorboardX import SummaryWriter
  finally:
    if block:
      del sys.modules["torch"]
  return SummaryWriter(logdir)


def truncate_records(path: str, last_step: int) -> int:
  """Keeps the complete lines of a metrics.jsonl with `step <= last_step`; returns lines dropped.
  Rewritten atomically, and only when something is dropped."""
  if not os.path.isfile(path):  # also leaves devices and pipes alone
    return 0
  with open(path, "rb") as f:
    data = f.read()
  keep, dropped = [], 0
  for line in data.split(b"\n"):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      ok = isinstance(record, dict) and int(record.get("step", 0)) <= last_step
    except (ValueError, TypeError):
      ok = False  # a partial line: the write it belonged to never finished
    if ok:
      keep.append(line)
    else:
      dropped += 1
  if dropped or (data and not data.endswith(b"\n")):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
      f.write(b"".join(l + b"\n" for l in keep))
    os.replace(tmp, path)
  return dropped


def _scalar(v):
  if hasattr(v, "item"):
    v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)  # JSON has no NaN/inf; keep the fact visible
  return v


class Progress:
  """A tqdm bar with loss, tokens/s and ETA on a terminal; plain periodic lines otherwise."""

  def __init__(self, total: int, initial: int = 0, enabled: bool = True, every: int = 10, desc: str = "train"):
    self.total, self.every, self.enabled, self.desc = total, every, enabled, desc
    self._bar = None
    self._start, self._start_step = time.time(), initial
    if enabled and sys.stderr.isatty():
      from tqdm import tqdm
      self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, file=sys.stderr)

  def update(self, step: int, info: dict[str, Any]) -> None:
    if not self.enabled:
      return
    text = " ".join(f"{k}={_fmt(v)}" for k, v in info.items())
    if self._bar is not None:
      self._bar.n = step
      self._bar.set_postfix_str(text, refresh=True)
      return
    if step % self.every == 0 or step == self.total:
      done = step - self._start_step
      elapsed = time.time() - self._start
      eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
      print(f"{self.desc} step {step}/{self.total} {text} eta={_fmt_time(eta)}", file=sys.stderr, flush=True)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


def _fmt(v):
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v)


def _fmt_time(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def throughput(tokens: int, seconds: float, flops_per_token: float, num_devices: int) -> dict[str, float]:
  """tokens/s, TFLOP/s per device and MFU (where the device's peak is known) for a timed span."""
  out = {"tokens_per_sec": tokens / seconds,
         "tflops_per_device": tokens * flops_per_token / seconds / num_devices / 1e12}
  peak = peak_flops_per_device()
  if peak is not None:
    out["mfu"] = out["tflops_per_device"] * 1e12 / peak
  return out
