"""`python -m nsl`: the version, what an nsl command runs with on this host (`nsl.hostmem`), and
every `python -m nsl.…` command with one line saying what it does.

The commands are found, not listed by hand: every module of the package (the kernels included,
wherever `nsl.kernels` lives) whose source runs a main under `if __name__ == "__main__"`. Each
line is the first sentence of the module's docstring, so a new command documents itself here.
Nothing is imported to find them (importing the models pulls in JAX; reading sources is instant).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re

from nsl import __version__, hostmem

_MAIN_GUARD = re.compile(r"""^if __name__ == ["']__main__["']:""", re.MULTILINE)
_COMMAND = re.compile(r"`python -m [^`]*`:?")


def _package_roots() -> list[tuple[str, str]]:
  """(module prefix, directory) of nsl and of `nsl.kernels`: a namespace package (no __init__.py), so
  the walk of nsl/ does not enter it; in a source checkout it is the top-level kernels/ folder."""
  roots = [("nsl", os.path.dirname(os.path.abspath(__file__)))]
  spec = importlib.util.find_spec("nsl.kernels")
  for location in (spec.submodule_search_locations or []) if spec else []:
    roots.append(("nsl.kernels", os.path.abspath(location)))
  return roots


def commands() -> dict[str, str]:
  """{module name: its docstring's first sentence} for every module of nsl with a main."""
  found = {}
  for prefix, root in _package_roots():
    for folder, dirs, files in os.walk(root):
      dirs[:] = sorted(d for d in dirs if os.path.isfile(os.path.join(folder, d, "__init__.py")))
      rel = os.path.relpath(folder, root)
      package = prefix if rel == "." else prefix + "." + rel.replace(os.sep, ".")
      for f in sorted(files):
        if not f.endswith(".py") or f in ("__init__.py", "__main__.py"):
          continue
        with open(os.path.join(folder, f), encoding="utf-8") as fh:
          source = fh.read()
        if _MAIN_GUARD.search(source):
          found[f"{package}.{f[:-3]}"] = summary(ast.get_docstring(ast.parse(source)) or "")
  return dict(sorted(found.items()))


def summary(docstring: str, width: int = 100) -> str:
  """The first sentence of a docstring without its usage (`python -m …`), backticks or parentheses,
  followed by the next paragraph's first sentence when it is only a few words; at most `width`."""
  sentences = []
  for paragraph in docstring.split("\n\n"):
    text = " ".join(_COMMAND.sub("", paragraph).split())
    text = re.sub(r"\s+\([^()]*\)", "", text).replace("`", "").strip(" :.")
    if text and not text.startswith("python -m"):
      sentence = re.split(r"(?<=[a-z0-9])\. ", text, maxsplit=1)[0].rstrip(".")
      first_word = sentence.split()[0]
      if sentences and (len(first_word) == 1 or first_word[1:].islower()):  # it follows a colon
        sentence = sentence[0].lower() + sentence[1:]
      sentences.append(sentence)
      if len(" ".join(sentences)) >= 30:
        break
  line = ": ".join(sentences)
  line = line[:1].upper() + line[1:]
  return line if len(line) <= width else line[:width - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def main() -> int:
  print(f"nsl {__version__}; host huge pages: {hostmem.status()}")
  print("\nCommands (python -m NAME --help for each one's options):")
  listed = commands()
  width = max(map(len, listed))
  for name, line in listed.items():
    print(f"  {name:<{width}}  {line}")
  print("\nDocumentation: docs/ (make docs serves it), starting with docs/index.md.")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
