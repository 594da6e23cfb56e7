"""The front door's text: a short README whose links resolve, docs a clone can follow, and reference
pages that keep up with the code. (`make test` also builds the site with `mkdocs build --strict`,
which checks every link, anchor and the nav.)"""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def _read(*parts: str) -> str:
  with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
    return f.read()


def _pages() -> list[str]:
  return sorted(os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(DOCS) for f in fs
                if f.endswith(".md"))


def test_the_readme_is_short_and_its_links_resolve():
  text = _read("README.md")
  assert len(text.splitlines()) <= 250
  assert "make demo" in text and "make test" in text
  targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
  assert targets, "the README links into the docs"
  missing = [t for t in targets if "://" not in t and not os.path.exists(os.path.join(ROOT, t))]
  assert not missing, f"README links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", ["README.md"] + _pages())
def test_no_page_points_where_a_clone_cannot_follow(page):
  text = _read(page)
  for pattern in (r"\.\./shared", r"REFERENCES\s*§", r"\bDESIGN\b"):
    assert not re.search(pattern, text), f"{page} cites {pattern!r}: state the fact, or link a docs page"


def test_every_base_config_field_is_in_the_config_reference():
  from configs import base

  def leaves(d, prefix=""):
    for k, v in d.items():
      if hasattr(v, "items"):
        yield from leaves(v, prefix + k + ".")
      else:
        yield prefix + k

  reference = _read("docs", "reference", "config.md")
  missing = [f for f in leaves(base.get_config()) if f"`{f}`" not in reference]
  assert not missing, f"docs/reference/config.md lacks {missing}: add a row with the default and meaning"


def test_every_command_has_a_section_in_the_cli_reference():
  from nsl import __main__ as nsl_main

  reference = _read("docs", "reference", "cli.md")
  missing = [m for m in nsl_main.commands() if f"### `{m}`" not in reference]
  assert not missing, f"docs/reference/cli.md lacks {missing}"


def test_every_image_is_shown_somewhere():
  shown = "\n".join(_read(p) for p in _pages())
  images = [os.path.relpath(os.path.join(d, f), DOCS) for d, _, fs in os.walk(os.path.join(DOCS, "img"))
            for f in fs if f.endswith(".png")]
  assert images
  unused = [i for i in images if os.path.basename(i) not in shown]
  assert not unused, f"images no page shows: {unused}"


def test_the_records_reference_names_exactly_the_chips_nsl_knows():
  from nsl import topology

  row = next(line for line in _read("docs", "reference", "records.md").splitlines() if line.startswith("| `mfu`"))
  named = set(re.findall(r"\b(?:[A-Z]\d{2,3}|v\d[a-z]?)\b", row))
  assert named == set(topology.CHIPS), f"records.md's mfu row names {sorted(named)}; nsl.topology.CHIPS: {sorted(topology.CHIPS)}"
