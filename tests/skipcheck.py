"""Every skip of a test run, listed at its end; in CI (CI=true, as .ci/run runs `make test`) a skip
caused by a missing extra or a file outside the repository fails the run (issue #56): a test that
matters runs in CI from the repository's own files, and a skip may only name a fact of the host
(no /dev/full, no way to mount a tmpfs, an accelerator this machine lacks).

A pytest plugin: tests/conftest.py takes its hooks; a run of other files loads it with
`-p tests.skipcheck` (tests/test_skipcheck.py). Under xdist the controller sees every worker's
reports, so only it lists and judges.
"""

from __future__ import annotations

import collections
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a skip for a missing package or a file the repository does not ship says.
MISSING = re.compile(r"not installed|pip install|could not import|no module named|\bextra\b|\.\./shared", re.I)
_skips: list[tuple[str, str]] = []


def _controller(config) -> bool:
  return not hasattr(config, "workerinput")


def _reason(report) -> str:
  longrepr = report.longrepr
  text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
  return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def outside_repository(reason: str) -> bool:
  """`reason` names a missing package, or a path beside the checkout rather than in it."""
  parent = os.path.dirname(ROOT) + os.sep
  paths = re.findall(r"(/[^\s'\":,;()]+)", reason)
  return bool(MISSING.search(reason)) or any(p.startswith(parent) and not p.startswith(ROOT + os.sep)
                                             for p in paths)


def pytest_runtest_logreport(report) -> None:
  if report.skipped and not getattr(report, "wasxfail", None):
    _skips.append((report.nodeid, _reason(report)))


def pytest_collectreport(report) -> None:
  if report.skipped:  # a module skipped whole (pytest.importorskip, a module-level skip)
    _skips.append((report.nodeid, _reason(report)))


def _bad() -> list[tuple[str, str]]:
  return [(node, reason) for node, reason in _skips if outside_repository(reason)]


def pytest_sessionfinish(session, exitstatus) -> None:
  if _controller(session.config) and os.environ.get("CI") == "true" and _bad() and exitstatus == 0:
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
  if not _controller(config) or not _skips:
    return
  counts = collections.Counter(reason for _, reason in _skips)
  terminalreporter.section(f"skip reasons ({len(_skips)} skipped)")
  for reason, n in counts.most_common():
    terminalreporter.line(f"{n:4d} x {reason}")
  bad = _bad()
  if bad:
    verdict = "fails the run (CI=true)" if os.environ.get("CI") == "true" else "would fail in CI"
    terminalreporter.line(f"nsl: {len(bad)} skip(s) for a missing extra or a file outside the repository "
                          f"{verdict}: {bad[0][0]}: {bad[0][1]}", red=True)
