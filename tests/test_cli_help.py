"""The command line as a front door: `python -m nsl` lists every command, each answers --help with
its whole description and every default, and docs/reference/cli.md is exactly what
tools/docs_cli.py writes from those --help texts."""

import ast
import difflib
import importlib.util
import os
import re
import subprocess
import sys

import pytest

from nsl import __main__ as nsl_main
from nsl.errors import ArgumentParser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = nsl_main.commands()
_spec = importlib.util.spec_from_file_location("docs_cli", os.path.join(ROOT, "tools", "docs_cli.py"))
docs_cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_cli)
STALE = "docs/reference/cli.md is not what --help prints: rerun .venv/bin/python tools/docs_cli.py"


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


def _same(page: str, wanted: str) -> None:
  if page != wanted:
    diff = difflib.unified_diff(page.splitlines(), wanted.splitlines(), "cli.md", "--help", lineterm="", n=1)
    pytest.fail(STALE + "\n" + "\n".join(list(diff)[:30]))


def _page() -> str:
  with open(docs_cli.PAGE, encoding="utf-8") as f:
    return f.read()


def _docstring(module: str) -> str:
  with open(importlib.util.find_spec(module).origin, encoding="utf-8") as f:
    return ast.get_docstring(ast.parse(f.read())) or ""


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_every_command_answers_help_with_its_whole_docstring_as_cli_md_shows_it(module):
  texts = docs_cli.helps(module)  # the command's --help and each subcommand's; stops when one fails
  assert all("usage:" in t and "shared/" not in t for t in texts.values())  # a clone has no ../shared/
  description = docs_cli.parse(texts[None])["description"]
  doc, shown = " ".join(_docstring(module).split()), " ".join(description.split())
  if doc not in shown and (doc.startswith(shown) or not shown.endswith(".")):  # its own text must be whole
    pytest.fail(f"{module} --help shows a cut description, not its module docstring: {description[:300]}")
  _same(docs_cli.sections_of(_page()).get(module, ""), docs_cli.section(module, texts))


def test_cli_md_is_the_page_the_tool_writes_around_those_sections():
  text = _page()
  _same(text, docs_cli.page(docs_cli.sections_of(text), COMMANDS))


def test_help_shows_each_default_but_not_an_empty_one():
  import nsl.report  # the running command's module: the parser finds its docstring among the imported ones

  p = ArgumentParser(prog="python -m nsl.report")  # a command: its module docstring describes it
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--lr", type=float, default=0.0, help="learning rate")
  p.add_argument("--out", default=None, help="where")
  p.add_argument("--quiet", action="store_true", help="no output")
  p.add_argument("--tags", default=[], action="append", help="labels")
  p.add_argument("--draft", type=int, default=3, help="drafted tokens (default: the run's)")
  text = " ".join(p.format_help().split())
  assert "--steps STEPS (default: 5)" in text and "learning rate (default: 0.0)" in text
  assert "where --quiet no output --tags TAGS labels" in text  # None, False and [] say nothing
  assert "drafted tokens (default: the run's)" in text and "(default: 3)" not in text  # said in words
  assert " ".join(nsl.report.__doc__.split()) in text
  q = ArgumentParser(prog="python -m nsl.report", description="Something else.")
  assert "Something else." in q.format_help() and "loss_curve" not in q.format_help()
