"""The guide and reference pages say what nsl does, in the present tense (docs/index.md, "How it
is built"): what was run, when and on what lives in the dated study sections of the papers/ and
xcheck/ pages. This scans the pages a user reads for the words of a study log."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCANNED = ("docs/guide", "docs/reference", "docs/index.md", "docs/design.md", "docs/benchmarks.md")

# Pages being rewritten by their owner; skipped until they are done (the list is to be emptied).
PENDING: set[str] = set()

# A study log's words: the project's own issues and sessions, relative time, unfinished work.
PATTERNS = (
    r"\bissues? #\d+",           # "issue #42": the project's tracker, not a reader's concern
    r"\(#\d+\)",                 # "(#44)"
    r"\bthis (round|session)\b",
    r"\bnext (round|session)\b",
    r"\bearlier (round|session|run)\b",
    r"\btoday'?s?\b",
    r"\bso far\b",
    r"\bthe brief\b",
    r"\bthe issue\b",
    r"\bnot yet\b",
    r"\bnot \w+ yet\b",          # "not searched yet", "not run yet"
    r"\brecompiled\b",
    r"\brunning a study\b",
    r"\bbudgeted\b",
    r"\bthe first thing to add\b",
    r"\bused to\b",
    r"\((before|now)\)",         # before/now table rows
    r"\b(was|were) tried\b",
    r"\bat the time\b",
    r"\bfor now\b",
    r"\b(TODO|FIXME|XXX)\b",
)


def _pages() -> list[str]:
  out = []
  for entry in SCANNED:
    path = os.path.join(ROOT, entry)
    if os.path.isfile(path):
      out.append(entry)
      continue
    for d, _, files in os.walk(path):
      out += [os.path.relpath(os.path.join(d, f), ROOT) for f in files if f.endswith(".md")]
  return sorted(p for p in out if p not in PENDING)


def offences(text: str, page: str) -> list[str]:
  """`page:line: matched text` for every pattern hit, code blocks included (a comment in an
  example is read too)."""
  found = []
  for n, line in enumerate(text.splitlines(), 1):
    for pattern in PATTERNS:
      m = re.search(pattern, line, flags=re.IGNORECASE)
      if m:
        found.append(f"{page}:{n}: {m.group(0)!r} ({pattern})")
  return found


def test_the_scan_finds_a_study_log():
  log = "Recompiled today (issue #42): not searched yet, within the 12 budgeted.\nfine line\n"
  hits = offences(log, "x.md")
  assert len(hits) == 5 and all(h.startswith("x.md:1:") for h in hits)
  assert not offences("A run is a function of its config. Start here.", "x.md")


def test_the_scan_covers_the_pages():
  pages = _pages()
  assert "docs/index.md" in pages and "docs/guide/scaling.md" in pages and "docs/reference/config.md" in pages
  assert not set(pages) & PENDING


@pytest.mark.parametrize("page", _pages())
def test_guide_and_reference_pages_read_as_documentation(page):
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    hits = offences(f.read(), page)
  assert not hits, ("study-log wording on a guide/reference page (move the study to a dated section of "
                    "a papers/ or xcheck/ page, or say it in the present tense):\n" + "\n".join(hits))
