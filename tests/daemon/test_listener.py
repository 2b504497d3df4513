"""The socket transport: the one direct write to a client's file descriptor."""

from __future__ import annotations

import pytest
import trio

from agentsd.listener import SocketTransport


async def test_the_socket_transport_writes_what_the_socket_takes_and_never_waits() -> None:
    ours, theirs = trio.socket.socketpair()
    with theirs:
        transport = SocketTransport(trio.SocketStream(ours))
        data = b"x" * (16 * 1024 * 1024)  # more than any socket buffer
        written = transport.write_now(data)
        assert 0 < written < len(data)
        assert transport.write_now(data) == 0  # full: nothing taken, no wait
        theirs.close()
        with pytest.raises(trio.BrokenResourceError):
            transport.write_now(b"x")
        await transport.stream.aclose()
        with pytest.raises(trio.BrokenResourceError):
            transport.write_now(b"x")  # a closed socket's fileno() is -1: never a reused fd
