"""docs/design.md's module tree is the tree: every Python module under nsl/ and kernels/ has its
line there, and every module listed exists (docs/design.md, "Every module, one line each")."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKED = ("nsl/", "kernels/")


def listed_files(text: str) -> set[str]:
  """The files the design page's tree names: a line `DIR/  description` opens a folder, an
  indented line `  NAME[, .EXT]  description` names its files (`.cc` after `flash_cpu.py` is
  `flash_cpu.cc`)."""
  block = re.search(r"```text\n(nsl/.*?)```", text, flags=re.DOTALL)
  assert block, "docs/design.md has no module tree (a ```text block starting with nsl/)"
  files, folder = set(), None
  for line in block.group(1).splitlines():
    head = re.match(r"^(\S+/)(\s|$)", line)
    if head:
      folder = head.group(1)
      continue
    entry = re.match(r"^  (\S.*?)(\s{2,}|$)", line)
    if entry and folder:
      stem = None
      for name in entry.group(1).split(", "):
        if name.startswith(".") and stem:
          name = stem + name
        stem = os.path.splitext(name)[0]
        files.add(folder + name)
  return files


def real_modules() -> set[str]:
  out = set()
  for top in CHECKED:
    for d, dirs, fs in os.walk(os.path.join(ROOT, top)):
      dirs[:] = [x for x in dirs if x != "__pycache__"]
      out |= {os.path.relpath(os.path.join(d, f), ROOT) for f in fs if f.endswith(".py")}
  return out


def test_the_parser_reads_folders_and_paired_files():
  text = "```text\nnsl/    the package\n  a.py    one\nkernels/   k\n  f.py, .cc   two\n```\n"
  assert listed_files(text) == {"nsl/a.py", "kernels/f.py", "kernels/f.cc"}


def test_the_design_tree_lists_every_module_and_nothing_else():
  with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
    listed = listed_files(f.read())
  real = real_modules()
  missing = sorted(real - {p for p in listed if p.endswith(".py")})
  assert not missing, f"modules docs/design.md's tree does not list (add a line each): {missing}"
  gone = sorted(p for p in listed if p.startswith(CHECKED) and not os.path.exists(os.path.join(ROOT, p)))
  assert not gone, f"docs/design.md's tree lists files that do not exist: {gone}"
