"""The short, seeded form of the crash-chaos harness (``make chaos`` runs 200 rounds)."""

from __future__ import annotations

from tests.e2e.chaos import run


def test_crash_chaos_short_form_has_no_violations() -> None:
    summary = run(rounds=4, seed=20261129, clients=3)
    assert summary.kills == 4
    assert summary.acked > 0, "the workload acknowledged nothing: the harness checked nothing"
    assert summary.violations == [], summary.violations


def test_crash_chaos_with_the_holder_has_no_violations() -> None:
    """The same, every agent held by the holder: it outlives each kill with their
    pipes, the next daemon's recovery ends them, and it leaves at the end."""
    summary = run(rounds=4, seed=20261201, clients=3, holder=True)
    assert summary.kills == 4
    assert summary.acked > 0, "the workload acknowledged nothing: the harness checked nothing"
    assert summary.violations == [], summary.violations
