"""`python -m nsl.compile --config=CFG --topology=v5p-64 [--eval] [--config.a.b=v ...]`

Compiles, ahead of time and on any host, the exact train step `nsl.launch` would run (the same
`nsl.train.program.Program`, not a copy) for the devices of a Cloud TPU slice, with libtpu's
real XLA:TPU and Mosaic compilers, and prints one JSON line: the slice, the mesh, the attention
implementation and dtype the platform chose, the Mosaic kernel count, compile seconds, per-chip
HBM (arguments, temporaries, outputs, aliased, peak estimate) against the chip's capacity, and
XLA-counted FLOPs per step against nsl's analytic count. A step that does not fit in HBM prints
its JSON line, then one error line naming the bytes and what would help, and exits 2.

XLA's cost analysis does not see inside Mosaic custom calls: with splash attention the XLA FLOPs
leave the attention kernels out (`xla_flops_exclude` says so), and a scanned layer stack
(`model.scan_layers`) is counted by XLA as one layer body per loop: compare FLOPs on an
unrolled stack (`--config.model.scan_layers=false`) with `--config.model.attention_impl=xla`.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from typing import Any

from nsl.errors import ArgumentParser, ConfigError, NslError, cli_main

MOSAIC_TARGET = 'custom_call_target="tpu_custom_call"'


def parse_args(argv: list[str]):
  from nsl.config import split_overrides

  parser = ArgumentParser(prog="python -m nsl.compile", description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True, help="config file with get_config()")
  parser.add_argument("--topology", required=True, help="TPU slice: v4-32, v5p-64, v5e-256, v6e-64, v5e:4x4")
  parser.add_argument("--eval", action="store_true", help="also compile the eval step")
  parser.add_argument("--num_slices", type=int, default=1, help="multi-slice (DCN) compiles")
  overrides, rest = split_overrides(argv)
  return parser.parse_args(rest), overrides


def memory_report(compiled) -> dict[str, int]:
  """Per-chip bytes from XLA's memory analysis; peak = arguments + outputs + temporaries − aliased
  (donated state is counted once), the estimate MaxText's train_compile prints too."""
  m = compiled.memory_analysis()
  out = {"argument_bytes": int(m.argument_size_in_bytes), "output_bytes": int(m.output_size_in_bytes),
         "temp_bytes": int(m.temp_size_in_bytes), "alias_bytes": int(m.alias_size_in_bytes),
         "code_bytes": int(m.generated_code_size_in_bytes)}
  out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
  return out


def count_mosaic(compiled) -> int:
  return compiled.as_text().count(MOSAIC_TARGET)


def xla_flops(compiled) -> float | None:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  flops = (cost or {}).get("flops")
  return float(flops) if flops is not None and flops >= 0 else None


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _oom_figures(message: str) -> tuple[int | None, int | None, str]:
  """(bytes needed, bytes available, what) from XLA:TPU's RESOURCE_EXHAUSTED compile error, e.g.
  "the total memory required for HLO temporaries (25.04G) exceeds available HBM (15.75G)"."""
  m = re.search(r"required for ([\w ]+?) \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)", message)
  if not m:
    return None, None, "the step"
  need = int(float(m.group(2)) * _UNITS[m.group(3)])
  have = int(float(m.group(4)) * _UNITS[m.group(5)])
  return need, have, m.group(1)


def advice(config, program) -> str:
  data, fsdp, tensor = program.mesh.devices.shape
  tips = []
  if fsdp < program.mesh.size:
    tips.append(f"shard parameters and optimizer state wider (config.mesh.shape=(1,{program.mesh.size // tensor},{tensor}) "
                "puts every chip on fsdp)")
  if config.model.remat == "none":
    tips.append("recompute activations (config.model.remat=full)")
  tips.append("split the batch into micro-batches (config.train.grad_accum) or use a larger slice")
  return "; ".join(tips)


def fit_verdict(record: dict[str, Any]) -> str:
  gib = lambda b: f"{b / 2**30:.2f} GiB"
  if record.get("peak_bytes") is not None:
    return f"the train step needs {gib(record['peak_bytes'])} per chip, over the chip's {gib(record['hbm_bytes_per_chip'])} of HBM"
  if record.get("oom_bytes") is not None:
    return (f"XLA needs {gib(record['oom_bytes'])} per chip for {record['oom_what']} alone, over the "
            f"{gib(record['oom_available_bytes'])} of HBM it can use")
  return f"XLA ran out of the chip's {gib(record['hbm_bytes_per_chip'])} of HBM"


def compile_step(program, lower: str = "train") -> tuple[Any, float]:
  t0 = time.time()
  # A compile-only client can write executables to JAX's persistent cache but never load them
  # back: keep them out of it (and the cache's warnings out of the output).
  with _no_persistent_cache():
    lowered = program.lower_train() if lower == "train" else program.lower_eval()
    compiled = lowered.compile()
  return compiled, time.time() - t0


@contextlib.contextmanager
def _no_persistent_cache():
  """JAX decides once per process whether its persistent cache is on (memoised at the first
  compile), so turning the flag off is not enough: reset that decision on the way in and out."""
  from jax._src import compilation_cache  # private: the flag's memo has no public reset
  from jax._src import config as jax_config

  compilation_cache.reset_cache()
  try:
    with jax_config.enable_compilation_cache(False):
      yield
  finally:
    compilation_cache.reset_cache()


def report(config, program, sl) -> tuple[dict[str, Any], Any]:
  """Compiles the train step for the slice; the JSON record and the compiled executable."""
  choices = program.describe()
  record: dict[str, Any] = {
      "config": None, "topology": sl.name, "topology_name": sl.topology_name, "chips": sl.chips,
      "hosts": sl.hosts, "device_kind": sl.devices[0].device_kind,
      "mesh": dict(zip(program.mesh.axis_names, (int(s) for s in program.mesh.devices.shape))),
      "family": config.family, "variant": config.model.variant, "remat": config.model.remat,
      "scan_layers": bool(config.model.get("scan_layers", False)), **choices,
      "params_total": program.counts["params_total"], "batch": int(config.train.batch_size),
      "seq_len": int(config.data.seq_len), "grad_accum": int(config.train.grad_accum),
  }
  try:
    compiled, seconds = compile_step(program)
  except Exception as e:  # XLA's out-of-memory verdict is a compile error on TPU
    text = " ".join(str(e).split())
    if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
      raise
    need, have, what = _oom_figures(text)
    record.update(fits=False, hbm_bytes_per_chip=sl.generation.hbm_bytes, oom_bytes=need,
                  oom_available_bytes=have, oom_what=what, error=text[:300])
    return record, None
  mem = memory_report(compiled)
  flops = xla_flops(compiled)
  analytic = program.flops_per_token * program.tokens_per_step
  kernels = count_mosaic(compiled)
  record.update(
      compile_seconds=round(seconds, 2), mosaic_kernels=kernels, **mem,
      hbm_bytes_per_chip=sl.generation.hbm_bytes, hbm_fraction=round(mem["peak_bytes"] / sl.generation.hbm_bytes, 4),
      fits=mem["peak_bytes"] <= sl.generation.hbm_bytes,
      xla_flops_per_step=None if flops is None else flops * sl.chips, analytic_flops_per_step=analytic,
      flops_ratio=None if flops is None else round(flops * sl.chips / analytic, 4),
  )
  if kernels:
    record["xla_flops_exclude"] = "Mosaic kernels (attention)"
  if record["scan_layers"]:
    record["xla_flops_exclude"] = ", ".join(filter(None, [record.get("xla_flops_exclude"), "all but one scanned layer"]))
  return record, compiled


@cli_main
def main(argv: list[str] | None = None) -> int:
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  import jax

  # Compile-only executables cannot be loaded back from JAX's persistent cache (a warning per
  # entry); this command compiles each program once anyway, so it never uses the cache.
  jax.config.update("jax_enable_compilation_cache", False)
  from nsl import config as nsl_config
  from nsl import topology
  from nsl.train import program as program_lib

  if args.num_slices < 1:
    raise ConfigError(f"--num_slices={args.num_slices} must be at least 1")
  config = nsl_config.load_config(args.config, overrides)
  sl = topology.get(args.topology, args.num_slices)
  program = program_lib.Program(config, sl.devices)
  record, _ = report(config, program, sl)
  record["config"] = args.config
  if args.eval and record["fits"]:
    compiled, seconds = compile_step(program, "eval")
    record["eval"] = {"compile_seconds": round(seconds, 2), "mosaic_kernels": count_mosaic(compiled),
                      **memory_report(compiled)}
  print(json.dumps(record, sort_keys=True), flush=True)
  if not record["fits"]:
    raise NslError(f"{args.config} does not fit on {sl.name}: {fit_verdict(record)} (mesh {record['mesh']}, "
                   f"remat={config.model.remat}); {advice(config, program)}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
