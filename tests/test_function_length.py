"""No function in nsl/ or kernels/ is longer than 80 lines (the project's style, issue #55): a
longer one is split into named parts a reader can follow."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT = 80


def long_functions(tops=("nsl", "kernels"), limit: int = LIMIT) -> list[str]:
  out = []
  for top in tops:
    for d, dirs, files in os.walk(os.path.join(ROOT, top)):
      dirs[:] = [x for x in dirs if x != "__pycache__"]
      for name in files:
        if not name.endswith(".py"):
          continue
        path = os.path.join(d, name)
        with open(path, encoding="utf-8") as f:
          tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
              out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}: {lines} lines")
  return out


def test_no_function_is_longer_than_80_lines():
  found = long_functions()
  assert not found, "split these into named parts:\n" + "\n".join(found)


def test_the_check_counts_a_long_function(tmp_path):
  body = "\n".join(f"  x{i} = {i}" for i in range(LIMIT))
  (tmp_path / "m.py").write_text(f"def f():\n{body}\n")
  global ROOT
  root, ROOT = ROOT, str(tmp_path.parent)
  try:
    assert long_functions((tmp_path.name,)) == [f"{tmp_path.name}/m.py:1 f: {LIMIT + 1} lines"]
  finally:
    ROOT = root
