"""The command line as a front door: `python -m nsl` lists every command, and each answers --help."""

import os
import re
import subprocess
import sys

import pytest

from nsl import __main__ as nsl_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = nsl_main.commands()


def _modules_with_a_main_in_the_tree() -> set[str]:
  """Found independently of `nsl.__main__`: a plain scan of nsl/ and kernels/ (nsl.kernels)."""
  found = set()
  for top, prefix in (("nsl", "nsl"), ("kernels", "nsl.kernels")):
    for folder, _, files in os.walk(os.path.join(ROOT, top)):
      for f in files:
        path = os.path.join(folder, f)
        if f.endswith(".py") and f != "__main__.py" and 'if __name__ == "__main__":' in open(path).read():
          rel = os.path.relpath(path, os.path.join(ROOT, top))[:-3].replace(os.sep, ".")
          found.add(f"{prefix}.{rel}")
  return found


def test_python_m_nsl_lists_every_command_with_a_line_each():
  assert set(COMMANDS) == _modules_with_a_main_in_the_tree()
  assert {"nsl.launch", "nsl.compile", "nsl.hbm", "nsl.report", "nsl.scaling.grid"} <= set(COMMANDS)
  out = subprocess.run([sys.executable, "-m", "nsl"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
  listed = dict(re.findall(r"^  (nsl\.\S+) +(.+)$", out, re.MULTILINE))
  assert listed == COMMANDS
  assert all(len(line) >= 10 for line in listed.values()), listed


def test_a_summary_is_the_docstrings_first_sentence_without_usage_or_citations():
  doc = "`python -m nsl.x --a=B`: trains a model on the embedded corpus (see elsewhere). More.\n\nSecond paragraph."
  assert nsl_main.summary(doc) == "Trains a model on the embedded corpus"
  assert nsl_main.summary("Short.\n\nModes: train trains the model. Rest.") == "Short: modes: train trains the model"
  assert nsl_main.summary("word " * 40).endswith("…") and len(nsl_main.summary("word " * 40)) <= 100
  assert nsl_main.summary("Path-star graphs G_{d,ℓ}: labels d(ℓ-1)+1.") == "Path-star graphs G_{d,ℓ}: labels d(ℓ-1)+1"


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_every_command_answers_help(module):
  result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "usage:" in result.stdout
  assert "shared/" not in result.stdout + result.stderr  # a clone has no ../shared/
  with open(os.path.join(ROOT, "docs", "reference", "cli.md"), encoding="utf-8") as f:
    section = f.read().split(f"### `{module}`", 1)[-1].split("\n### ", 1)[0]
  options = set(re.findall(r"^\s+(?:-\w, )?(--[\w-]+)", result.stdout, re.MULTILINE)) - {"--help"}
  undocumented = sorted(o for o in options if f"`{o}" not in section)
  assert not undocumented, (f"docs/reference/cli.md's {module} section lacks {undocumented}: "
                            "rerun python tools/docs_cli.py")
