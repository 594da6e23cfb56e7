"""Every citation in the code resolves in a clone: a `docs/<page>.md#anchor` cited in nsl/, kernels/,
configs/, launch/ or tools/ names a docs page that exists and has that anchor, and nothing cites the
sources a clone does not have (`REFERENCES §n`, `DESIGN "..."`, `README "..."`, `../shared/`)."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE_DIRS = ("nsl", "kernels", "configs", "launch", "tools")
SOURCE_EXTS = (".py", ".cc", ".h", ".sh")
CITATION = re.compile(r"\bdocs/([\w/.-]+?\.md)(?:#([\w-]+))?")
GONE = re.compile(r"REFERENCES\s*§|\bDESIGN \"|\bREADME \"|README's|\.\./shared")


def _sources(dirs=CODE_DIRS) -> list[str]:
  found = []
  for top in dirs:
    for folder, subdirs, files in os.walk(os.path.join(ROOT, top)):
      subdirs[:] = sorted(d for d in subdirs if d != "__pycache__" and not d.startswith("."))
      found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(SOURCE_EXTS)]
  return found


def slugify(heading: str) -> str:
  """Python-Markdown's toc slug: markup and punctuation dropped, lowercase, spaces -> hyphens."""
  text = re.sub(r"[`*]|<[^>]*>", "", heading)
  text = re.sub(r"[^\w\s-]", "", text).strip().lower()
  return re.sub(r"[-\s]+", "-", text)


def anchors(page_text: str) -> set[str]:
  """The ids mkdocs gives a page's headings: an explicit `{#id}`, else the slugified heading text.
  Lines inside fenced code blocks are not headings."""
  found, fenced = set(), False
  for line in page_text.splitlines():
    if line.lstrip().startswith(("```", "~~~")):
      fenced = not fenced
      continue
    m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
    if m:
      explicit = re.search(r"\{[^}]*#([\w-]+)[^}]*\}\s*$", m.group(1))
      found.add(explicit.group(1) if explicit else slugify(m.group(1)))
  return found


def test_anchors_are_read_as_mkdocs_builds_them():
  page = "# Title\n## Sizes and recipe {#ladder}\n## What `attention_impl=auto` runs where\n```\n# not a heading\n```\n"
  assert anchors(page) == {"title", "ladder", "what-attention_implauto-runs-where"}


def _citations() -> list[tuple[str, str, str]]:
  """(where, page, anchor or '') of every docs citation in the code."""
  cited = []
  for path in _sources():
    with open(path, encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        for m in CITATION.finditer(line):
          cited.append((f"{os.path.relpath(path, ROOT)}:{number}", m.group(1), m.group(2) or ""))
  return cited


def test_the_code_cites_docs_pages():
  assert len(_citations()) >= 50  # the sweep of issue #43 left about a hundred


@pytest.mark.parametrize("page", sorted({page for _, page, _ in _citations()}))
def test_every_cited_page_and_anchor_exists(page):
  path = os.path.join(ROOT, "docs", page)
  assert os.path.isfile(path), f"docs/{page} is cited but does not exist"
  with open(path, encoding="utf-8") as f:
    have = anchors(f.read())
  missing = [f"{where}: #{anchor}" for where, p, anchor in _citations() if p == page and anchor and anchor not in have]
  assert not missing, f"docs/{page} has no such anchor: {missing}"


def test_nothing_cites_what_a_clone_does_not_have():
  hits = []
  for path in _sources():
    with open(path, encoding="utf-8") as f:
      hits += [f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}" for n, line in enumerate(f, 1) if GONE.search(line)]
  assert not hits, "cite the docs page instead (docs/<page>.md#anchor):\n" + "\n".join(hits)
