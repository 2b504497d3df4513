"""A restart stops accepting before its reply goes out (``agentsd.socket_keeper``
Rule 5): the client that got the reply may connect at once, and its connection must
wait in the listener's backlog for the next image, not be accepted by this one and
dropped at its exec."""

from __future__ import annotations

import functools
import socket
from pathlib import Path

import trio

from agentsd.server import _serve_connections
from tests.daemon.test_delete_race import Harness, harness
from tests.polling import eventually

__all__ = ["harness"]  # the fixture

SCHEDULER_PASSES = 50  # each one polls for I/O: an accept that could happen has


async def test_a_client_connecting_once_a_restart_was_asked_waits_for_the_next_image(
    harness: Harness, tmp_path: Path
) -> None:
    app = harness.daemon.app
    path = str(tmp_path / "listener.sock")
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener.bind(path)
    listener.listen(16)
    before = len(app.connections)
    with listener, socket.socket(socket.AF_UNIX) as early, socket.socket(socket.AF_UNIX) as late:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(_serve_connections, listener, app=app, nursery=nursery)
            )
            early.connect(path)
            await eventually(lambda: len(app.connections) == before + 1)
            app.stop_accepting()  # what the restart handler does before it replies
            late.connect(path)
            for _ in range(SCHEDULER_PASSES):
                await trio.lowlevel.checkpoint()
            assert len(app.connections) == before + 1, "accepted by the image that is ending"
            # Still in the backlog, for whoever takes the listener next.
            with trio.fail_after(5):
                kept, _ = await listener.accept()
            kept.close()
            nursery.cancel_scope.cancel()
