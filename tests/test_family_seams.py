"""Outside nsl/models/, nothing asks which family it holds (docs/design.md#families, issue #55): no
isinstance on a family class, no comparison of a family or variant with a name, no per-family
capability flag on the `Family` base class. Callers ask the family (its decoder, its views)."""

import os
import re

from nsl.models.family import Family

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILY_CLASSES = r"(Family|StandardFamily|SPSFamily|LiftFamily|NextLatFamily|MTPFamily|DoubleDecoderFamily|SEDFamily)"
ASKS = [
    re.compile(r"isinstance\([^)]*\b" + FAMILY_CLASSES + r"\b"),  # isinstance(x, LiftFamily)
    re.compile(r"\b(family|variant)\s*(==|!=)\s*[\"']"),  # config.family == "sps"
    re.compile(r"[\"']\s*(==|!=)\s*[\w.]*\b(family|variant)\b"),  # "sps" == config.family
    re.compile(r"\b(family|variant)\s+(not\s+)?in\s*[(\[{]\s*[\"']"),  # family in ("standard", "sps")
    re.compile(r"\bfamily\.name\s*(==|!=|in\b|not in\b)"),  # family.name == ...
    re.compile(r"\bfamily\.(decodes_with_trunk|drafts_with_dynamics|eval_suffix|feeds)\b"),  # flags the decoder and views replaced
]
# LIFT's feed names, spelled as strings where the evaluations and the trainer run: a view is named
# by the family (Family.views), never by them.
VIEW_NAMES = re.compile(r"[\"'](teacher|bias)[\"']")
VIEW_FREE = ("nsl/evals/", "nsl/train/")
FLAGS = ("decodes_with_trunk", "drafts_with_dynamics", "feeds", "eval_suffix")


def offending_lines() -> list[str]:
  hits = []
  for top in ("nsl", "kernels"):
    for d, dirs, files in os.walk(os.path.join(ROOT, top)):
      dirs[:] = [x for x in dirs if x != "__pycache__"]
      if os.path.relpath(d, ROOT).replace(os.sep, "/").startswith("nsl/models"):
        continue
      for name in files:
        if not name.endswith(".py"):
          continue
        path = os.path.join(d, name)
        with open(path, encoding="utf-8") as f:
          for i, line in enumerate(f, 1):
            code = line.split("#", 1)[0]
            rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
            if any(p.search(code) for p in ASKS) or (rel.startswith(VIEW_FREE) and VIEW_NAMES.search(code)):
              hits.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
  return hits


def test_no_caller_outside_the_models_asks_which_family_it_holds():
  hits = offending_lines()
  assert not hits, "ask the family instead (Family.decoder(), its views):\n" + "\n".join(hits)


def test_the_patterns_catch_what_they_forbid():
  asks = ['if isinstance(family, DoubleDecoderFamily):', 'if config.family == "sps":', 'if base.family not in ("standard", "sps"):',
          'elif family.decodes_with_trunk:', 'ok = "standard" != c.model.variant', 'if family.name == "lift":',
          'suffix = family.eval_suffix', 'if feed in family.feeds:']
  for line in asks:
    assert any(p.search(line) for p in ASKS), line
  assert VIEW_NAMES.search('choices=("own", "teacher", "bias")')
  assert not any(p.search('row = {"family": family if variant in (None, family) else name}') for p in ASKS)


def test_the_base_class_carries_no_capability_flags():
  assert not [f for f in FLAGS if hasattr(Family, f)]
