"""The Python half of `tools/gpu_check.sh` (docs/guide/accelerators.md): one JSON line per figure.

`python tools/gpu_check.py kernels [--cpu-dry-run]`
  Every rule of tests/kernels/kernel_cases.py through the Pallas GPU kernel (`flash_gpu`), and
  the rules cuDNN takes through `nsl.kernels.cudnn`, against the dense reference: output, lse and
  the gradients of q, k, v, each line with the largest error relative to the reference's scale
  and `ok`. On a GPU the kernel runs compiled (the line says `compiled` and counts the Triton
  calls in the lowered program; interpret mode would be no test of the Triton lowering), once
  alone and once under shard_map on a mesh of the local GPUs. `--cpu-dry-run`: the same code in
  Pallas interpret mode at tiny sizes, cuDNN's rules through `implementation="xla"`.

`python tools/gpu_check.py tag NAME < lines.jsonl` sets `check` to NAME on each line.

`python tools/gpu_check.py mfu < train_step.jsonl`
  Adds to each `nsl.bench.train_step` line the chip's published peak (`nsl.topology.CHIPS`, by
  this machine's `device_kind`) and `mfu` = achieved FLOP/s / peak (null off a known chip).

Exit status 1 when a kernel line is not ok, so the shell script reports the failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "kernels")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def _errors(actual, expected) -> float:
  """max |a − e| / max(1, max |e|) over the finite reference entries; inf if the -inf rows differ."""
  a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  if not np.array_equal(np.isneginf(a), np.isneginf(e)):
    return float("inf")
  fin = np.isfinite(e)
  if not fin.any():
    return 0.0
  scale = max(1.0, float(np.abs(e[fin]).max()))
  return float(np.abs(a[fin] - e[fin]).max() / scale)


_DENSE: dict = {}  # (rule name, dtype) -> the dense reference's (out, lse, grads): one compile each


def _compare(kc, case, fn, heads, head_dim, dtype, with_lse=True):
  q, k, v = kc.qkv(case, heads, head_dim, dtype=dtype)
  t0 = time.perf_counter()
  out, lse, grads = kc.run(fn, q, k, v)
  seconds = time.perf_counter() - t0
  key = (case.name, jnp.dtype(dtype).name)
  if key not in _DENSE:
    f32 = lambda x: x.astype(jnp.float32)
    _DENSE[key] = kc.run(kc.dense(case), f32(q), f32(k), f32(v))
  out_d, lse_d, grads_d = _DENSE[key]
  err = {"out": _errors(out, out_d)}
  if with_lse:
    err["lse"] = _errors(lse, lse_d)
  err.update({f"d{n}": _errors(g, gd) for n, g, gd in zip("qkv", grads, grads_d)})
  finite = all(np.isfinite(g).all() for g in grads)
  return err, finite, seconds


def kernels(args) -> int:
  import kernel_cases as kc
  from nsl.kernels import cudnn, flash_gpu

  on_gpu = jax.default_backend() == "gpu"
  if not on_gpu and not args.cpu_dry_run:
    print(json.dumps({"check": "kernels", "ok": False, "error": f"no GPU (backend {jax.default_backend()}); "
                      "pass --cpu-dry-run to run the same checks in interpret mode"}))
    return 1
  tokens, block, heads, head_dim = (32, 16, 2, 16) if args.cpu_dry_run else (512, 64, 4, 64)
  interpret = not on_gpu
  cases = [c for c in kc.make_cases(tokens) if not args.rules or c.name in args.rules]
  if args.rules and len(cases) != len(set(args.rules)):
    known = ", ".join(c.name for c in kc.make_cases(8))
    print(json.dumps({"check": "kernels", "ok": False, "error": f"--rules: choose from {known}"}))
    return 2
  devices = jax.devices()
  mesh = jax.sharding.Mesh(np.asarray(devices).reshape(1, len(devices), 1), ("data", "fsdp", "tensor"))
  failures = 0
  # float32 (full-precision dots) checks the algorithm tightly; bfloat16 is the training dtype.
  for dtype, tol in ((jnp.float32, 2e-4), (jnp.bfloat16, 3e-2)):
    for case in cases:
      for sharded in (False, True):
        fn = lambda q, k, v, case=case, sharded=sharded: flash_gpu.attend(
            q, k, v, case.rule, case.q_slots, case.k_slots, block_q=block, block_k=block, interpret=interpret,
            mesh=mesh if sharded else None)
        line = {"check": "kernel", "impl": "pallas_gpu", "rule": case.name, "dtype": jnp.dtype(dtype).name,
                "slots": case.q_slots.layout.num_slots, "heads": heads, "head_dim": head_dim, "block": block,
                "sharded": sharded, "compiled": not interpret, "devices": len(devices)}
        if not interpret:
          q, k, v = kc.qkv(case, heads, head_dim, dtype=dtype)
          line["triton_calls"] = jax.jit(fn).lower(q, k, v).as_text().count("triton")
        failures += _emit(line, *_compare(kc, case, fn, heads, head_dim, dtype), tol)
    for case in cases:
      q, k, v = kc.qkv(case, heads, head_dim, dtype=dtype)
      if not cudnn.supports(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16),
                            case.rule, case.q_slots, case.k_slots):
        continue
      impl = "cudnn" if on_gpu else "xla"
      if (impl == "cudnn") != (dtype == jnp.bfloat16):
        # cuDNN flash attention takes 16-bit floats only; off GPU the same call on XLA checks the
        # translation in float32 (XLA's bf16 reference itself loses ~0.3 in dq, dk).
        continue
      fn = lambda q, k, v, case=case: (cudnn.attend(q, k, v, case.rule, case.q_slots, case.k_slots,
                                                    implementation=impl)[0],
                                       jnp.zeros((q.shape[0], q.shape[2], q.shape[1])))
      line = {"check": "kernel", "impl": "cudnn", "implementation": impl, "rule": case.name,
              "dtype": jnp.dtype(dtype).name, "slots": case.q_slots.layout.num_slots, "heads": heads,
              "head_dim": head_dim, "compiled": impl == "cudnn"}
      failures += _emit(line, *_compare(kc, case, fn, heads, head_dim, dtype, with_lse=False), tol)
  print(json.dumps({"check": "kernels", "ok": failures == 0, "failures": failures,
                    "device": devices[0].device_kind, "jax": jax.__version__}), flush=True)
  return 1 if failures else 0


def _emit(line, err, finite, seconds, tol) -> int:
  ok = finite and max(err.values()) <= tol and (not line.get("compiled") or line.get("triton_calls", 1) > 0)
  line.update(errors={k: round(v, 7) for k, v in err.items()}, tolerance=tol, grads_finite=bool(finite),
              seconds=round(seconds, 3), ok=bool(ok))
  print(json.dumps(line), flush=True)
  return 0 if ok else 1


def mfu(args) -> int:
  from nsl import topology

  kind = jax.devices()[0].device_kind
  chip = topology.chip_for_device(kind)
  for raw in sys.stdin:
    if not raw.startswith("{"):
      continue
    line = json.loads(raw)
    achieved = line.get("achieved_gflops")
    line.update(check="train_step", device_kind=kind, chip=None if chip is None else chip.name,
                peak_flops_per_chip=None if chip is None else chip.peak_bf16_flops)
    devices = int(line.get("devices") or 1)
    line["mfu"] = (None if chip is None or achieved is None else
                   round(achieved * 1e9 / (devices * chip.peak_bf16_flops), 4))
    print(json.dumps(line, sort_keys=True), flush=True)
  return 0


def tag(args) -> int:
  """Passes JSON lines through with `check` set to the step's name (the benchmark's own lines)."""
  for raw in sys.stdin:
    if raw.startswith("{"):
      print(json.dumps({"check": args.name, **json.loads(raw)}), flush=True)
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python tools/gpu_check.py", description=__doc__.split("\n")[0])
  parser.add_argument("what", choices=("kernels", "mfu", "tag"))
  parser.add_argument("name", nargs="?", default="", help="with tag: the check name to set")
  parser.add_argument("--cpu-dry-run", action="store_true", help="interpret mode, tiny sizes (no GPU)")
  parser.add_argument("--rules", default="", help="comma-separated kernel_cases names (default: all)")
  args = parser.parse_args(argv)
  args.rules = [r for r in args.rules.split(",") if r]
  return {"kernels": kernels, "mfu": mfu, "tag": tag}[args.what](args)


if __name__ == "__main__":
  raise SystemExit(main())
