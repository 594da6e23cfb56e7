"""`python -m nsl.compile --config=CFG --topology=v5p-64 [--eval] [--config.a.b=v ...]`

Compiles, ahead of time and on any host, the exact train step `nsl.launch` would run (the same
`nsl.train.program.Program`, not a copy) for the devices of a Cloud TPU slice, with libtpu's
real XLA:TPU and Mosaic compilers, and prints one JSON line: the slice, the mesh, the attention
implementation and dtype the platform chose, the Mosaic kernel count, compile seconds, per-chip
HBM (arguments, temporaries, outputs, aliased, peak estimate) against the chip's capacity,
XLA-counted FLOPs per step against nsl's analytic count, and a roofline bound. A step that does
not fit in HBM prints its JSON line, then one error line naming the bytes and what would help,
and exits 2.

FLOPs: XLA's cost analysis counts a while loop's body once, so a scanned layer stack
(`model.scan_layers`, the paper recipe's default) would count one layer of L. `loop_cost` costs
every loop body with XLA's own cost model and multiplies it by the loop's known trip count
(nested loops too), so `xla_flops_per_step` is the step's work whichever way the layers are
built. XLA cannot see inside Mosaic custom calls: with splash the attention kernels' FLOPs are
left out (`xla_flops_exclude` says so).

Roofline (docs/guide/accelerators.md): the chip's published peak bf16 FLOP/s and HBM bandwidth
(`nsl.topology.CHIPS`) bound the step from below, `roofline_step_seconds = max(compute, memory)`
with compute = max(XLA's FLOPs, the analytic FLOPs) / chips / peak (both are work the step must
do: a strict floor) and memory = XLA's estimate of bytes accessed per chip / bandwidth (its cost
model's traffic for the program as compiled, not a proven minimum); `roofline_mfu` = analytic
FLOPs / (chips × peak × that time) is the model-FLOPs utilisation this compiled step can reach
at best under those figures.
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
  parser.add_argument("--config", required=True,
                      help="config file with get_config(), or FILE.py:ARG (configs/sps.py:xl)")
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


# The optimized HLO text: a computation starts with `[ENTRY ]%name (params) -> result {` and ends
# with a line `}`; a while names its condition and body and, where XLA:CPU/GPU proved it, its
# trip count (XLA:TPU's optimized text drops that annotation: `_trip_count` reads the loop).
_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_WHILE = re.compile(r"\swhile\(%([\w.\-]+)\), condition=%?([\w.\-]+), body=%?([\w.\-]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_METADATA = re.compile(r',\s*metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
_DEF = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*)$")
COST_KEYS = ("flops", "bytes accessed")


def _defs(lines: list[str]) -> tuple[dict[str, str], str | None]:
  """A computation's instructions, name -> right-hand side, and its ROOT's name."""
  out, root = {}, None
  for line in lines[1:]:
    m = _DEF.match(line)
    if m:
      out[m.group(2)] = m.group(3)
      root = m.group(2) if m.group(1) else root
  return out, root


def _int_constant(defs: dict[str, str], name: str, depth: int = 6) -> int | None:
  """The value of an s32/s64 scalar `name` that is a constant, through copies and converts."""
  rhs = defs.get(name, "")
  m = re.match(r"[su](?:32|64)\[\]\S* constant\((-?\d+)\)", rhs)
  if m:
    return int(m.group(1))
  m = re.match(r"\S+ (?:copy|bitcast|convert)\(%([\w.\-]+)\)", rhs)
  return _int_constant(defs, m.group(1), depth - 1) if m and depth else None


def _tuple_operands(rhs: str) -> list[str]:
  m = re.search(r"\btuple\(([^)]*)\)", rhs)
  return [] if m is None else re.findall(r"%([\w.\-]+)", re.sub(r"/\*index=\d+\*/", "", m.group(1)))


def _step(body: list[str], k: int) -> int | None:
  """The constant the body adds to tuple element k (the loop counter), or None."""
  defs, root = _defs(body)
  operands = _tuple_operands(defs.get(root, ""))
  if k >= len(operands):
    return None
  m = re.match(r"\S+ add\(%([\w.\-]+), %([\w.\-]+)\)", defs.get(operands[k], ""))
  if not m:
    return None
  for a, b in ((m.group(1), m.group(2)), (m.group(2), m.group(1))):
    for _ in range(6):  # through copies to the counter's get-tuple-element
      if re.match(rf"\S+ get-tuple-element\(%[\w.\-]+\), index={k}\b", defs.get(a, "")):
        return _int_constant(defs, b)
      unary = re.match(r"\S+ (?:copy|bitcast|convert)\(%([\w.\-]+)\)", defs.get(a, ""))
      if unary is None:
        break
      a = unary.group(1)
  return None


def _trip_count(while_line: str, caller: dict[str, str], cond: list[str], body: list[str]) -> int | None:
  """Trips of a counted loop `for (i = init; i < bound; i += step)` (jax.lax.scan's form, and
  XLA's windowed-einsum loops, which it unrolls to steps of 2): the annotation when present,
  else ceil((bound − init) / step) read from the condition's ROOT compare, the loop's initial
  tuple and the body's update of the counter; None when the loop has another form."""
  known = _TRIPS.search(while_line)
  if known:
    return int(known.group(1))
  defs, root = _defs(cond)
  m = re.match(r"pred\[\]\S* compare\(%([\w.\-]+), %([\w.\-]+)\), direction=(LT|GT)", defs.get(root, ""))
  if not m:
    return None
  counter, bound = (m.group(1), m.group(2)) if m.group(3) == "LT" else (m.group(2), m.group(1))
  index = re.match(r"\S+ get-tuple-element\(%[\w.\-]+\), index=(\d+)", defs.get(counter, ""))
  limit = _int_constant(defs, bound)
  if index is None or limit is None:
    return None
  k = int(index.group(1))
  operands = _tuple_operands(caller.get(_WHILE.search(while_line).group(1), ""))
  init = _int_constant(caller, operands[k]) if k < len(operands) else None
  step = _step(body, k)
  if init is None or not step or step < 0:
    return None
  return max(0, -(-(limit - init) // step))


class LoopCost:
  """XLA's cost analysis of an optimized HLO module with every while body counted per trip.

  XLA's `HloCostAnalysis` visits a while body once. Here each body is re-entered as the ENTRY of
  a copy of the module and costed by XLA's cost model (a host client's: a compile-only TPU
  client has none), then
  full(c) = cost(c) + Σ_{while w in c} (trips_w · full(body_w) − cost(body_w)),
  recursively (a scan inside a scanned layer is counted trips × trips). A loop whose trip count
  cannot be read is counted once and counted in `unknown_trip_loops`.
  """

  def __init__(self, hlo_text: str, client):
    self.client = client
    self.computations: dict[str, list[str]] = {}
    self.entry = None
    current = None
    for line in _METADATA.sub("", hlo_text).splitlines():
      m = _COMPUTATION.match(line) if current is None else None
      if m:
        current = m.group(2)
        self.computations[current] = [line]
        self.entry = current if m.group(1) else self.entry
      elif current is not None:
        self.computations[current].append(line)
        if line.rstrip() == "}":  # not "}}, backend_config=...": strings in attributes span lines
          current = None
    self._once: dict[str, dict[str, float]] = {}
    self._full: dict[str, dict[str, float]] = {}
    self.loops: list[int] = []  # trip counts of the loops found, outermost first
    self.unknown_trip_loops = 0

  def once(self, name: str) -> dict[str, float]:
    """XLA's cost of computation `name` as an entry (its loops' bodies counted once)."""
    if name not in self._once:
      from jax._src.lib import xla_client
      import jaxlib._hlo as hlo  # the HLO parser jaxlib ships (no public path)

      lines = ["HloModule loop_cost"]
      for comp, body in self.computations.items():
        head = body[0][len("ENTRY "):] if body[0].startswith("ENTRY ") else body[0]
        lines += (["ENTRY " + head] if comp == name else [head]) + body[1:] + [""]
      module = hlo.hlo_module_from_text("\n".join(lines))
      cost = xla_client._xla.hlo_module_cost_analysis(self.client, module)
      self._once[name] = {k: float(cost.get(k, 0.0)) for k in COST_KEYS}
    return self._once[name]

  def full(self, name: str | None = None) -> dict[str, float]:
    name = name or self.entry
    if name not in self._full:
      total = dict(self.once(name))
      defs, _ = _defs(self.computations[name])
      for line in self.computations[name]:
        w = _WHILE.search(line)
        if not w:
          continue
        n = _trip_count(line, defs, self.computations.get(w.group(2), []), self.computations.get(w.group(3), []))
        if n is None:
          self.unknown_trip_loops += 1
          continue
        self.loops.append(n)
        inner, once = self.full(w.group(3)), self.once(w.group(3))
        for k in COST_KEYS:
          total[k] += n * inner[k] - once[k]
      self._full[name] = total
    return self._full[name]


def loop_cost(compiled, clients) -> LoopCost | None:
  """`LoopCost` of a compiled executable with the first of `clients` that can cost HLO, or None
  where none can (then the caller keeps XLA's once-per-loop count and says so)."""
  from nsl import topology

  text = compiled.as_text()
  for client in clients:
    try:
      with topology._quiet_stderr():  # the parser warns about stack frames the text does not carry
        cost = LoopCost(text, client)
        cost.full()
      return cost
    except Exception:  # this client cannot cost HLO (a compile-only one), or the text did not parse
      continue
  return None


def cost_clients(devices) -> list:
  """The devices' client, then the host CPU's (its cost model is the same HloCostAnalysis)."""
  import jax

  clients = [devices[0].client]
  try:
    clients.append(jax.devices("cpu")[0].client)
  except RuntimeError:  # JAX_PLATFORMS without cpu
    pass
  return clients


def roofline(chip, chips: int, xla_flops_step: float | None, analytic_flops_step: float,
             bytes_per_chip: float | None) -> dict[str, Any]:
  """The step time and MFU the compiled step cannot beat on `chips` chips (module docstring)."""
  work = max(xla_flops_step or 0.0, analytic_flops_step) / chips
  compute_s = work / chip.peak_bf16_flops
  memory_s = (bytes_per_chip or 0.0) / chip.hbm_bandwidth
  step_s = max(compute_s, memory_s)
  return {"chip": chip.name, "peak_flops_per_chip": chip.peak_bf16_flops,
          "hbm_bandwidth_per_chip": chip.hbm_bandwidth,
          "roofline_compute_seconds": round(compute_s, 6), "roofline_memory_seconds": round(memory_s, 6),
          "roofline_step_seconds": round(step_s, 6), "roofline_bound": "compute" if compute_s >= memory_s else "memory",
          "roofline_mfu": round(analytic_flops_step / (chips * chip.peak_bf16_flops * step_s), 4) if step_s else None}


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
      "scan_layers": bool(config.model.scan_layers), **choices,
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
  once = xla_flops(compiled)
  loops = loop_cost(compiled, cost_clients(sl.devices))
  flops = loops.full()["flops"] if loops else once
  analytic = program.flops_per_token * program.tokens_per_step
  kernels = count_mosaic(compiled)
  record.update(
      compile_seconds=round(seconds, 2), mosaic_kernels=kernels, **mem,
      hbm_bytes_per_chip=sl.generation.hbm_bytes, hbm_fraction=round(mem["peak_bytes"] / sl.generation.hbm_bytes, 4),
      fits=mem["peak_bytes"] <= sl.generation.hbm_bytes,
      xla_flops_per_step=None if flops is None else flops * sl.chips, analytic_flops_per_step=analytic,
      flops_ratio=None if flops is None else round(flops * sl.chips / analytic, 4),
      xla_flops_loops_once_per_step=None if once is None else once * sl.chips,
      loop_trip_counts=loops.loops if loops else None,
      **roofline(sl.generation.chip, sl.chips, None if flops is None else flops * sl.chips, analytic,
                 loops.full()["bytes accessed"] if loops else None),
  )
  excluded = ["Mosaic kernels (attention)"] if kernels else []
  if loops is None and record["scan_layers"]:
    excluded.append("all but one trip of each loop (its HLO could not be re-costed)")
  elif loops is not None and loops.unknown_trip_loops:
    excluded.append(f"all but one trip of {loops.unknown_trip_loops} loop(s) of unknown trip count")
  if excluded:
    record["xla_flops_exclude"] = ", ".join(excluded)
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
