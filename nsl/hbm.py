"""What fits where in TPU HBM: the smallest slice of each generation that trains each config.

  python -m nsl.hbm [--configs=configs/sps.py:xl,...] [--generations=v5p,v5e,v6e] [--out=FILE] [--table]

For each config and TPU generation, the smallest slice on which the train step
compiles (`nsl.compile`'s own path) within the chip's HBM, trying on each slice the all-FSDP mesh
`(1, chips, 1)` without, then with, `model.remat=full`. Slices whose chip count does not divide
the global batch are skipped (the batch is split over data × fsdp), as are slices where the
train state alone (16 bytes a parameter: fp32 weights, gradients and two Adam moments) cannot
fit. Every attempt is appended to `--out` as a JSON line, and a rerun skips the pairs already
decided, so an interrupted table resumes. `--table` prints the markdown table of
docs/guide/pods.md from the file (`docs/hbm_fits.jsonl` holds the committed search).
"""

from __future__ import annotations

import json
import os
import sys
import time

from nsl.errors import ArgumentParser, ConfigError, cli_main

LADDER = [f"configs/sps.py:{v}_{s}" for s in ("xs", "s", "m", "l", "xl")
          for v in ("standard", "sps", "twox_memory", "delayed_state", "reverse_sps")]
DEFAULT_CONFIGS = LADDER + ["configs/dd.py:dd_100m", "configs/lift.py:lift_tiny", "configs/nextlat.py:nextlat_tiny"]
STATE_BYTES_PER_PARAM = 16


def slices_for(generation: str) -> list[str]:
  from nsl import topology

  g = topology.GENERATIONS[generation]
  shapes = topology.SHAPES_3D if g.dims == 3 else topology.SHAPES_2D
  return [f"{g.name}-{chips * g.cores_per_name_unit}" for chips in sorted(shapes)]


def attempt(config_path: str, slice_name: str, remat: str) -> dict:
  """One compile of `config_path` on `slice_name` with the all-FSDP mesh: its record."""
  from nsl import compile as nsl_compile
  from nsl import config as nsl_config
  from nsl import topology
  from nsl.train import program as program_lib

  sl = topology.get(slice_name)
  overrides = [("mesh.shape", f"(1,{sl.chips},1)"), ("model.remat", remat)]
  config = nsl_config.load_config(config_path, overrides)
  base = {"config": config_path, "topology": slice_name, "generation": sl.generation.name, "chips": sl.chips,
          "remat": remat, "mesh": [1, sl.chips, 1]}
  t0 = time.time()
  try:
    program = program_lib.Program(config, sl.devices)
  except ConfigError as e:
    return {**base, "fits": False, "skipped": str(e)}
  state_bytes = STATE_BYTES_PER_PARAM * program.counts["params_total"] / sl.chips
  if state_bytes > sl.generation.hbm_bytes:
    return {**base, "fits": False, "skipped": f"train state alone is {state_bytes / 2**30:.1f} GiB per chip"}
  record, _ = nsl_compile.report(config, program, sl)
  record.update(base, wall_seconds=round(time.time() - t0, 1))
  return record


def search(config_path: str, generation: str, log) -> dict | None:
  """The smallest fitting slice of `generation` for `config_path` (records every attempt)."""
  for slice_name in slices_for(generation):
    for remat in ("none", "full"):
      record = attempt(config_path, slice_name, remat)
      log(record)
      if record.get("fits"):
        return record
      if record.get("skipped"):
        break  # neither remat setting changes the mesh or the state size
  return None


def load(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:  # a partial last line of an interrupted run
        pass
  return rows


def table(rows: list[dict], generations: list[str]) -> str:
  """Markdown: per config, the smallest fitting slice per generation with mesh, remat, HBM, compile."""
  best: dict[tuple[str, str], dict] = {}
  for r in rows:
    if r.get("fits"):
      key = (r["config"], r["generation"])
      if key not in best or r["chips"] < best[key]["chips"]:
        best[key] = r
  decided = {(r["config"], r["generation"]) for r in rows if r.get("done")}
  configs = list(dict.fromkeys(r["config"] for r in rows))
  head = "| config | " + " | ".join(generations) + " |\n|---|" + "---|" * len(generations) + "\n"
  lines = []
  for c in configs:
    cells = []
    for g in generations:
      r = best.get((c, g))
      if r:
        cells.append(f"{r['topology']} fsdp {r['chips']}, remat {r['remat']}, "
                     f"{r['peak_bytes'] / 2**30:.1f} GiB, {r['compile_seconds']:.0f} s")
      else:
        cells.append("no slice (see text)" if (c, g) in decided else "not run")
    lines.append(f"| {os.path.basename(c)} | " + " | ".join(cells) + " |")
  return head + "\n".join(lines)


@cli_main
def main(argv: list[str] | None = None) -> int:
  parser = ArgumentParser(prog="python -m nsl.hbm", description=__doc__.split("\n")[0])
  parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                      help="comma-separated FILE[:ARG] configs (default: configs/sps.py's ladder, xs to xl, each "
                           "variant; configs/dd.py:dd_100m, configs/lift.py:lift_tiny, "
                           "configs/nextlat.py:nextlat_tiny)")
  parser.add_argument("--generations", default="v5p,v5e,v6e", help="TPU generations to search")
  parser.add_argument("--out", default="hbm_fits.jsonl",
                      help="JSON lines, one per attempt (appended; a rerun resumes the search)")
  parser.add_argument("--table", action="store_true", help="print the table from --out and exit")
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  generations = [g for g in args.generations.split(",") if g]
  from nsl import topology
  for g in generations:
    if g not in topology.GENERATIONS:
      raise ConfigError(f"--generations: unknown {g!r}; choose from {','.join(topology.GENERATIONS)}")
  if args.table:
    print(table(load(args.out), generations))
    return 0
  done = {(r["config"], r["generation"]) for r in load(args.out) if r.get("done")}

  def log(record):
    with open(args.out, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")
    print(json.dumps({k: record.get(k) for k in ("config", "topology", "remat", "fits", "peak_bytes",
                                                 "compile_seconds", "skipped")}), flush=True)

  for config_path in [c for c in args.configs.split(",") if c]:
    for g in generations:
      if (config_path, g) in done:
        continue
      found = search(config_path, g, log)
      log({"config": config_path, "generation": g, "done": True, "fits": False,
           "smallest": found["topology"] if found else None})
  print(table(load(args.out), generations))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
