"""The bridge as a process: ACP on this process's stdin and stdout, logs on stderr.

Rule 1: stdout carries protocol only; every diagnostic goes to stderr.

Rule 2: the bridge ends when the editor closes stdin (or stdout); it never ends a
daemon session, so a turn running when it is killed runs on.
"""

from __future__ import annotations

import logging
import os
import sys

import trio

from agentsctl.acp.bridge import Bridge, BridgeConfig
from agentsctl.acp.peer import Peer
from agentsctl.async_client import open_client, sole_exception


async def serve_acp(
    receive_stream: trio.abc.ReceiveStream, send_stream: trio.abc.SendStream, config: BridgeConfig
) -> None:
    """Serve one editor on a pair of byte streams until it closes its end.

    Raises ``DaemonUnreachable`` (or a subclass) if the daemon cannot be reached at
    the start; later daemon failures become JSON-RPC errors for the editor.
    """
    async with open_client(config.socket_path) as client:
        bridge = Bridge(
            lambda b: Peer(
                send_stream,
                receive_stream,
                on_request=b.on_request,
                on_notification=b.on_notification,
            ),
            client,
            config,
        )
        await bridge.serve()


async def serve_stdio(config: BridgeConfig) -> None:
    """``serve_acp`` on duplicates of fds 0 and 1 (closing them leaves 0 and 1 open)."""
    receive = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    send = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
    async with receive, send:
        await serve_acp(receive, send, config)


def run_bridge(config: BridgeConfig) -> int:
    """Run the bridge until the editor goes away; returns the exit status (0).

    Raises ``DaemonUnreachable`` when the daemon cannot be reached at the start, for
    the CLI to report (Rule 1 of ``agentsctl.cli``: exit 3).
    """
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="agentsctl acp: %(message)s"
    )
    try:
        trio.run(serve_stdio, config)
    except BaseExceptionGroup as group:
        # Nurseries wrap what escapes them; the CLI maps DaemonUnreachable, not a group.
        sole = sole_exception(group)
        if sole is group:
            raise
        raise sole from sole.__cause__
    return 0
