"""Every family's tiny config trained briefly from the command line, and its final state digest.

`python tools/family_digests.py [--out DIR] [--json FILE] [--only NAME ...]` trains each config of
`CONFIGS` through `python -m nsl.launch` for `STEPS` steps with the same `OVERRIDES`, and prints a
markdown table of each run's `state_sha256` (result.json; docs/guide/determinism.md). A refactor
that must not change what a family computes is checked by running it before and after: equal
digests, the same final bits (docs/xcheck/family_digests.md holds the table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The smallest config of each family and variant (docs/guide/configs.md#the-files), with any
# overrides of its own after a space.
CONFIGS = (
    "configs/tiny.py",
    "configs/sps.py:standard_tiny",
    "configs/sps.py:sps_tiny",
    "configs/sps.py:twox_memory_tiny",
    "configs/sps.py:delayed_state_tiny",
    "configs/sps.py:reverse_sps_tiny",
    "configs/sps.py:standard_tiny --config.family=sps",  # SPS's standard variant: an alias of the family
    "configs/dd.py:dd_tiny",
    "configs/dd.py:sed_tiny",
    "configs/dd.py:decoder_only_tiny",
    "configs/lift.py:lift_tiny",
    "configs/nextlat.py:nextlat_tiny",
    "configs/nextlat.py:mtp_tiny",
)
STEPS = 6
# Short and cheap on 2 CPU cores, one eval and one checkpoint at the end; the same for every config.
OVERRIDES = (f"--config.train.steps={STEPS}", "--config.train.warmup_steps=2", "--config.train.decay_steps=2",
             "--config.train.batch_size=4", f"--config.train.eval_every={STEPS}", "--config.train.eval_batches=1",
             f"--config.checkpoint.every={STEPS}")


def train(config: str, workdir: str) -> dict:
  """One run through the CLI; its config, digest, final loss and wall time."""
  t0 = time.time()
  path, *own = config.split()
  cmd = [sys.executable, "-m", "nsl.launch", f"--config={path}", f"--workdir={workdir}", "--quiet", *OVERRIDES, *own]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  if proc.returncode != 0:
    return {"config": config, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
  with open(os.path.join(workdir, "result.json")) as f:
    result = json.load(f)
  return {"config": config, "state_sha256": result.get("state_sha256"),
          "final_loss": result.get("final_loss"), "seconds": round(time.time() - t0, 1)}


def table(rows: list[dict]) -> str:
  lines = ["| config | state_sha256 |", "|---|---|"]
  for r in rows:
    lines.append(f"| `{r['config']}` | {r.get('state_sha256') or 'error: ' + r.get('error', '?')} |")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", help="directory for the runs (default: a temporary one)")
  parser.add_argument("--json", help="write the rows here as JSON")
  parser.add_argument("--only", nargs="*", help="configs to run (default: all of CONFIGS)")
  args = parser.parse_args(argv)
  out = args.out or tempfile.mkdtemp(prefix="family_digests_")
  rows = []
  for i, config in enumerate(args.only or CONFIGS):
    rows.append(train(config, os.path.join(out, f"{i:02d}")))
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"overrides": list(OVERRIDES), "rows": rows}, f, indent=1)
  print(table(rows))
  return 0 if all("state_sha256" in r and r["state_sha256"] for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
