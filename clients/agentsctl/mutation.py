"""Mutations sent by the CLI: idempotent, and retried once across a dropped connection.

Rule 1: each mutation a command sends carries a ``clientOperationId`` minted (uuid4)
for that mutation in this invocation, never reused by another invocation.

Rule 2: when the connection drops before the reply arrives (``DaemonDisconnected``:
the daemon crashed, restarted, or cut us off), whether the mutation took effect is
unknown. It is sent once more, with the same id and params, on a new connection: the
daemon's ledger replays the recorded answer if the first attempt took effect and runs
it otherwise (DESIGN.md invariant 7). A second drop propagates (exit 3). A timeout is
not retried: the request may still be running, and the user decides.
"""

from __future__ import annotations

import sys
import uuid
from typing import TYPE_CHECKING, TypeVar

import msgspec

from agentsctl.daemon import DaemonDisconnected
from agentsd_protocol.api.base import MutationParams
from agentsd_protocol.methods import Method

if TYPE_CHECKING:
    from agentsctl.target import Target

P = TypeVar("P", bound=MutationParams)
R = TypeVar("R")


def new_operation_id() -> str:
    """A fresh ``clientOperationId`` (Rule 1)."""
    return str(uuid.uuid4())


def mutate(target: Target, method: Method[P, R], params: P) -> R:
    """Send ``method`` with ``params`` under a fresh operation id; its typed result.

    Connects through ``target.client()`` (which may start the daemon). Raises the
    daemon's ``RpcError`` for an error answer, ``DaemonUnreachable`` when no daemon
    can be reached (or the retry dropped too), and ``TimeoutError`` when the daemon
    does not answer in time.
    """
    params = msgspec.structs.replace(params, client_operation_id=new_operation_id())
    try:
        with target.client() as client:
            return client.call(method, params)
    except DaemonDisconnected as exc:
        operation = params.client_operation_id
        print(
            f"agentsctl: {exc.message}; retrying {method.name} (operation {operation})",
            file=sys.stderr,
        )
    with target.client() as client:
        return client.call(method, params)
