"""Every config the documentation names exists: each `configs/FILE.py` that docs/**/*.md or
README.md mentions is a file (or an older path that nsl.config still resolves), and each
`configs/FILE.py:ARG` loads through nsl.config's own loader (the ARG is one `get_config` accepts).
Placeholders are not configs: a name with an upper-case letter (`configs/X.py`, `:VARIANT_SIZE`),
`...`, or a one-letter file name (`configs/a.py`); `{a,b}_tiny` stands for each of its names."""

import glob
import os
import re

from nsl import config as nsl_config
from nsl.errors import ConfigError
from tests.helpers import ROOT

MENTION = re.compile(r"configs/([\w./-]+?\.py)(?::(\{[\w,]*\}\w*|\w+))?")


def _placeholder(file: str, arg: str | None) -> bool:
  name = file + (arg or "")
  return any(c.isupper() for c in name) or "..." in name or len(os.path.basename(file)) == len("a.py")


def _expand(arg: str) -> list[str]:
  m = re.fullmatch(r"\{([\w,]*)\}(\w*)", arg)
  return [f"{a}{m.group(2)}" for a in m.group(1).split(",")] if m else [arg]


def mentions() -> dict[str, list[str]]:
  """{`configs/FILE.py[:ARG]`: the pages naming it}, placeholders left out."""
  found = {}
  pages = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)) + [os.path.join(ROOT, "README.md")]
  for page in pages:
    with open(page, encoding="utf-8") as f:
      text = f.read()
    for file, arg in MENTION.findall(text):
      if _placeholder(file, arg):
        continue
      for one in _expand(arg) if arg else [None]:
        spec = f"configs/{file}" + (f":{one}" if one else "")
        found.setdefault(spec, []).append(os.path.relpath(page, ROOT))
  return {spec: sorted(set(where)) for spec, where in sorted(found.items())}


MENTIONS = mentions()


def test_the_docs_name_configs():  # the scan finds what the pages show (a broken pattern finds nothing)
  assert {"configs/tiny.py", "configs/demo.py", "configs/sps.py:xl", "configs/dd.py:dd_50m"} <= set(MENTIONS)


def test_every_config_the_docs_name_resolves():
  broken = []
  for spec, pages in MENTIONS.items():
    path, arg = nsl_config.resolve_config(os.path.join(ROOT, spec))
    try:
      if arg is None and not os.path.isfile(path):
        raise ConfigError(f"no file {os.path.relpath(path, ROOT)}")
      if arg is not None:
        nsl_config.load_config(os.path.join(ROOT, spec))
    except ConfigError as e:
      broken.append(f"{spec} ({', '.join(pages)}): {str(e).replace(ROOT + '/', '')[:160]}")
  assert not broken, "configs the docs name that do not load:\n" + "\n".join(broken)
