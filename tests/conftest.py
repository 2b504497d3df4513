"""Under CI (``$CI`` set to anything but ``0``, ``false``, ``no`` or empty) a skip is
a failure: a green run must have exercised every test it collected. A test that
cannot run anywhere CI runs is named in ``ALLOWED_SKIPS`` with the reason; the
skips taken under that allowance are printed at the end of the run, so the CI log
shows exactly what was not proven.

Outside CI a missing tool (nvim, a peer CLI, root for a tmpfs) still skips, so a
contributor's laptop runs what it can.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

ALLOWED_SKIPS: dict[str, str] = {
    "tests/daemon/test_cgroup.py::test_a_fork_bomb_is_contained_by_pids_max": (
        "the pids controller is bound to the v1 hierarchy on CI's hybrid cgroup layout, "
        "so no cgroup v2 subtree here can enable it; it runs where v2 owns the controllers"
    ),
}
"""Node id (exactly as pytest prints it) -> why it cannot run wherever CI runs."""

_allowed_taken = pytest.StashKey[list[tuple[str, str]]]()


def ci_enabled() -> bool:
    """True when ``$CI`` asks for the strict run (GitHub, GitLab and ``.ci/run`` set it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _enforce(
    config: pytest.Config, report: pytest.CollectReport | pytest.TestReport, nodeid: str
) -> None:
    """Turn a skip of ``nodeid`` into a failure unless it is allow-listed."""
    if not report.skipped or hasattr(report, "wasxfail") or not ci_enabled():
        return
    reason = _skip_reason(report)
    allowed = ALLOWED_SKIPS.get(nodeid)
    if allowed is not None:
        config.stash.setdefault(_allowed_taken, []).append((nodeid, f"{reason} ({allowed})"))
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI, which forbids skips: {reason}\n"
        "(CI must provide what this test needs, or tests/conftest.py's ALLOWED_SKIPS must "
        "name the test and why it cannot run wherever CI runs)"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _enforce(item.config, report, item.nodeid)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A module that skips itself at import (``pytest.skip(allow_module_level=True)``)."""
    report = yield
    _enforce(collector.config, report, collector.nodeid)
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not ci_enabled():
        return
    taken = terminalreporter.config.stash.get(_allowed_taken, [])
    terminalreporter.section("skips allowed under CI")
    if not taken:
        terminalreporter.write_line("none: every collected test ran")
    for nodeid, reason in taken:
        terminalreporter.write_line(f"{nodeid}: {reason}")
