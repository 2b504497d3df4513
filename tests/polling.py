"""Waiting for a condition that another process makes true (a child exiting, a row
appearing): poll it under a deadline. For conditions inside this trio run, wait on
an event instead."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

import trio

POLL_INTERVAL_S = 0.02  # short next to any child's start-up; cheap to check


async def eventually(
    check: Callable[[], bool] | Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0
) -> None:
    """Return once ``check()`` is true; ``trio.TooSlowError`` after ``timeout_s``."""
    with trio.fail_after(timeout_s):
        while True:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await trio.sleep(POLL_INTERVAL_S)
