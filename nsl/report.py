"""`python -m nsl.report WORKDIR`: a run's outcome in a few lines, from its result.json, and its loss
curve drawn to WORKDIR/loss_curve.png (the trainer writes records only: matplotlib costs every run,
grid cells included, seconds of start-up for a picture most never open)."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from nsl.errors import ArgumentParser, DataError, cli_main


@cli_main
def main(argv: list[str] | None = None) -> int:
  parser = ArgumentParser(prog="python -m nsl.report", description=__doc__.split("\n")[0])
  parser.add_argument("workdir", metavar="WORKDIR", help="a run directory (nsl.launch --workdir)")
  argv = [parser.parse_args(sys.argv[1:] if argv is None else argv).workdir]
  from nsl import storage

  with tempfile.TemporaryDirectory() as tmp:  # a gs:// run's records are read from copies here
    records = storage.Records(argv[0], local=tmp)
    if records.remote:
      storage.check_bucket(argv[0], "WORKDIR")
      records.pull()
    curve = _report(argv[0], records.local)
    if curve and records.remote:
      remote = storage.join(argv[0], "loss_curve.png")
      storage.upload(curve, remote)
      curve = remote
  if curve:
    print(f"loss curve: {curve}")
  return 0


def _report(workdir: str, local: str) -> str | None:
  """Prints the outcome from `local` (the run directory or a copy of its records); the loss
  curve's path, drawn there."""
  path = os.path.join(local, "result.json")
  if not os.path.exists(path):
    raise DataError(f"{path if local == workdir else workdir + '/result.json'} does not exist: "
                    f"has the run in {workdir} finished?")
  with open(path) as f:
    r = json.load(f)
  print(f"run:        {workdir} ({r['family']}/{r['variant']}, status {r['status']})")
  print(f"parameters: {r['params_total']:,} ({r['params_non_embedding']:,} non-embedding)")
  print(f"trained:    {r['steps']} steps, {r['tokens']:,} tokens, {r['wall_time_sec']:.0f} s")
  val, uni = r.get("eval", {}).get("val"), r.get("unigram_entropy_nats")
  if val is not None:
    line = f"validation: {val:.4f} nats/token"
    if uni:
      line += f" (unigram entropy of the corpus: {uni:.4f} nats/token; the model is {uni - val:.3f} nats below it)"
    print(line)
  if r.get("state_sha256"):  # equal digests: the same final bits (docs/guide/determinism.md)
    print(f"state:      {r['state_sha256']}")
  from nsl import plots

  return plots.loss_curve(local)


if __name__ == "__main__":
  raise SystemExit(main())
