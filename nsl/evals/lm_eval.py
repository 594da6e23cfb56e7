"""Runs lm-evaluation-harness's command line with nsl's model registered as "nsl".

  python -m nsl.evals.lm_eval --model_args run=RUN_DIR --tasks arc_easy,hellaswag [--batch_size 16]
                              [--include_path DIR --local_only] [any other `lm_eval run` option]

lm-eval 0.4.x finds models only in its own registry (no plugin entry points), so this command
registers `nsl.evals.lm_eval_model.NslLM` and then hands every argument but its own to the
harness's CLI (`lm_eval run`): `--model` defaults to nsl, the output, the table and every flag are
the harness's (`lm_eval run --help`). Its own flag, `--local_only`, makes the harness index only
the tasks under `--include_path` (not its ~15,000 stock YAML files: ~20 s on 2 cores) and keeps
the Hugging Face libraries offline, for local tasks (docs/guide/evaluation.md#lm-eval-harness).
An unknown task is one line and exit status 2.
"""

from __future__ import annotations

import contextlib
import os
import sys

from nsl.errors import NslError, cli_main
from nsl.evals.nll import Parser

SUBCOMMANDS = ("run", "ls", "validate")


@contextlib.contextmanager
def _local_tasks_only(on: bool):
  """While on, the harness's TaskManager indexes only --include_path (it builds its own inside
  `lm_eval run`, with no option to skip the stock tasks)."""
  import lm_eval.tasks

  original = lm_eval.tasks.TaskManager

  class LocalTaskManager(original):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **dict(kwargs, include_defaults=False))

  if on:
    lm_eval.tasks.TaskManager = LocalTaskManager
  try:
    yield
  finally:
    lm_eval.tasks.TaskManager = original


def _flag_value(args: list[str], flag: str) -> str | None:
  for i, a in enumerate(args):
    if a == flag and i + 1 < len(args):
      return args[i + 1]
    if a.startswith(flag + "="):
      return a.split("=", 1)[1]
  return None


@cli_main
def main(argv: list[str] | None = None) -> int:
  p = Parser(prog="python -m nsl.evals.lm_eval", description=__doc__.split("\n")[0],
             usage="python -m nsl.evals.lm_eval [-h] [--local_only] [lm_eval run options]",
             epilog="Every other option goes to lm-eval's `lm_eval run` (see `lm_eval run --help`); "
                    "--model defaults to nsl, whose --model_args are run=RUN_DIR (required), data=DIR (where "
                    "the run's tokenizer is; default the run's data dir), batch_size, max_gen_toks (256) and "
                    "seed (sampling).")
  p.add_argument("--local_only", action="store_true",
                 help="know only the tasks under --include_path (skips indexing the harness's stock tasks) and "
                      "keep the Hugging Face libraries offline")
  args, rest = p.parse_known_args(sys.argv[1:] if argv is None else argv)
  from nsl.evals import zeroshot_tasks

  if args.local_only:
    if _flag_value(rest, "--include_path") is None:
      raise NslError("--local_only needs --include_path DIR, the folder of the task YAML files")
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # read when `datasets` is imported, below
      os.environ.setdefault(var, "1")
  zeroshot_tasks.require_lm_eval()
  from lm_eval._cli import HarnessCLI
  from lm_eval.utils import setup_logging

  from nsl.evals import lm_eval_model

  lm_eval_model.register()
  if not rest or rest[0] not in SUBCOMMANDS:
    rest = ["run", *rest]
  if rest[0] == "run" and _flag_value(rest, "--model") is None:
    rest[1:1] = ["--model", lm_eval_model.MODEL_NAME]
  setup_logging()
  cli = HarnessCLI()
  saved, sys.argv = sys.argv, ["lm-eval", *rest]  # the harness parses sys.argv itself
  try:
    parsed = cli.parse_args()
  finally:
    sys.argv = saved
  try:
    with _local_tasks_only(args.local_only):
      cli.execute(parsed)
  except ValueError as e:
    if str(e).startswith("Tasks not found"):
      where = "under --include_path" if args.local_only else "in lm-eval or under --include_path"
      raise NslError(f"{e} ({where}); `lm_eval ls tasks` lists lm-eval's tasks, --include_path DIR adds the "
                     "task YAML files in DIR") from None
    raise
  return 0


if __name__ == "__main__":  # run the imported module, so its warnings are not attributed to __main__
  from nsl.evals.lm_eval import main as _main

  sys.exit(_main())
