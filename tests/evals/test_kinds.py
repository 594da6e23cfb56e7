"""Each evaluator kind is defined once (nsl/evals/kinds.py): `config.evals` resolves to it with the
defaults the commands had, each stand-alone command takes its flags from it, and
docs/reference/evaluators.md is exactly what tools/docs_evaluators.py writes from it."""

import difflib
import importlib
import importlib.util
import os

import pytest

from nsl.errors import ArgumentParser, ConfigError, cli_main
from nsl.evals import kinds, specs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("docs_evaluators", os.path.join(ROOT, "tools", "docs_evaluators.py"))
docs_evaluators = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_evaluators)

# The resolved defaults of each kind as they were before the kinds were defined once (the table
# `specs.KINDS` and the commands' argparse): a change here changes what existing configs score.
DEFAULTS = {
    "nll": {"data": "d", "split": "val", "batches": 0},
    "zeroshot": {"task": "arc_easy", "data": "f", "limit": 0, "batch_size": 16},
    "length_generalization": {"data": "", "lengths": "", "per_length": 2000, "batch_size": 2000, "view": "own"},
    "planning": {"data": "", "limit": 0, "batch_size": 250, "temperature": 0.0, "sample_seed": 0},
}
REQUIRED = {"nll": {"data": "d"}, "zeroshot": {"task": "arc_easy", "data": "f"}}


def test_the_reference_page_is_what_the_tool_writes():
  with open(docs_evaluators.PAGE, encoding="utf-8") as f:
    page = f.read()
  wanted = docs_evaluators.page()
  if page != wanted:
    diff = difflib.unified_diff(page.splitlines(), wanted.splitlines(), "evaluators.md", "kinds.py", lineterm="", n=1)
    pytest.fail("docs/reference/evaluators.md is stale: rerun .venv/bin/python tools/docs_evaluators.py\n"
                + "\n".join(list(diff)[:30]))
  for kind in kinds.KINDS.values():  # every field of every kind, with its command flag
    assert all(f"| `{o.name}` |" in page for o in kinds.options(kind))
  assert "`--max_batches` (omitted: the whole split; given: ≥ 1)" in page


@pytest.mark.parametrize("kind", sorted(DEFAULTS))
def test_a_minimal_spec_resolves_to_the_defaults_it_always_had(kind):
  got = specs.resolve("x", {"kind": kind, **REQUIRED.get(kind, {})})
  assert type(got) is kinds.KINDS[kind] and got.kind == kind
  assert {o.name: getattr(got, o.name) for o in kinds.options(type(got))} == DEFAULTS[kind]
  assert specs.resolve("x", {"kind": "planning", "temperature": 1}).temperature == 1.0  # an int reads as a float
  assert type(specs.resolve("x", {"kind": "planning", "temperature": 1}).temperature) is float


@pytest.mark.parametrize("kind", sorted(DEFAULTS))
def test_a_command_without_flags_takes_the_fields_defaults_and_checks_their_ranges(kind):
  p = ArgumentParser(prog="x")
  kinds.add_flags(p, kinds.KINDS[kind])
  args = p.parse_args([])
  for o in kinds.options(kinds.KINDS[kind]):
    if o.flag_name is None:  # nll's and zeroshot's own --data / --task
      continue
    # an "unset" count is left out on the command line (None), every other default is the field's
    want = None if o.unset and o.type is int else DEFAULTS[kind][o.name]
    assert getattr(args, o.flag_name) == want, (kind, o.name)
  kinds.check_flags(args, kinds.KINDS[kind])  # the defaults are in range


@pytest.mark.parametrize("module, argv, message", [
    ("nll", ["--workdir=nowhere", "--max_batches=0"], "--max_batches=0: must be >= 1"),
    ("zeroshot", ["--workdir=nowhere", "--task=arc_easy=x.jsonl", "--limit=0"], "--limit=0: must be >= 1"),
    ("zeroshot", ["--workdir=nowhere", "--task=arc_easy=x.jsonl", "--batch_size=0"], "--batch_size=0: must be >= 1"),
    ("length_generalization", ["--runs=nowhere", "--per_length=0"], "--per_length=0: must be >= 1"),
    ("planning", ["--workdir=nowhere", "--temperature=-1"], "--temperature=-1.0: must be >= 0"),
    ("planning", ["--workdir=nowhere", "--limit=0"], "--limit=0: must be >= 1"),
])
def test_each_command_checks_its_kinds_flags_before_reading_the_run(module, argv, message, capsys):
  main = importlib.import_module(f"nsl.evals.{module}").main
  rc = cli_main(main)(argv)  # as `python -m` runs it (length_generalization's main is wrapped there)
  err = capsys.readouterr().err.strip()
  assert rc == 2 and err.endswith(message) and len(err.splitlines()) == 1, err


def test_the_feed_alias_and_a_renamed_flag_reach_the_same_field():
  p = ArgumentParser(prog="x")
  kinds.add_flags(p, kinds.LengthGeneralization)
  assert p.parse_args(["--feed=bias"]).view == "bias"
  q = ArgumentParser(prog="x")
  kinds.add_flags(q, kinds.Nll)
  assert q.parse_args(["--max_batches=3"]).max_batches == 3


def test_every_field_declares_a_type_help_and_what_the_command_takes_for_it():
  for kind in kinds.KINDS.values():
    assert kind.__doc__ and kind.command.startswith("nsl.evals.") and kind.metrics
    names = [o.flag_name for o in kinds.options(kind) if o.flag_name]
    assert len(names) == len(set(names)), kind
    for o in kinds.options(kind):
      assert o.type in (int, float, str) and o.help, (kind.kind, o.name)
      if o.flag_name is None:
        assert o.instead, (kind.kind, o.name)  # the command's own flag for it


def test_an_unknown_field_or_kind_names_the_nearest_one():
  with pytest.raises(ConfigError, match=r"config\.evals\.x\.per_lenght: not a field .*\(did you mean 'per_length'\?\)"):
    specs.resolve("x", {"kind": "length_generalization", "per_lenght": 8})
  with pytest.raises(ConfigError, match=r"config\.evals\.x\.kind='plannin' is unknown \(did you mean 'planning'\?\)"):
    specs.resolve("x", {"kind": "plannin"})
  with pytest.raises(ConfigError, match=r"config\.evals\.x\.task='hellaswg' is unknown \(did you mean 'hellaswag'\?\)"):
    specs.resolve("x", {"kind": "zeroshot", "task": "hellaswg", "data": "f"})
  with pytest.raises(ConfigError, match=r"config\.evals\.x\.zzz: not a field of a 'nll' evaluator; its fields"):
    specs.resolve("x", {"kind": "nll", "data": "d", "zzz": 1})
