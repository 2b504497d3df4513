"""From a decoded request to its handler: the one table of methods the daemon serves.

Rule 1: the table covers exactly the registry in ``agentsd_protocol.methods``; a test
checks both ways. Handlers live one module per method family.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agentsd.caller import POLICED_NON_MUTATIONS, Unidentified, refusal
from agentsd.connection import Call
from agentsd.handlers import attention as attention_handlers
from agentsd.handlers import continuity as continuity_handlers
from agentsd.handlers import controls as controls_handlers
from agentsd.handlers import conversation as conversation_handlers
from agentsd.handlers import daemon as daemon_handlers
from agentsd.handlers import queue as queue_handlers
from agentsd.handlers import session as session_handlers
from agentsd.handlers import stream as stream_handlers
from agentsd.operations import MAX_OPERATION_ID_CHARS, Operation, fingerprint
from agentsd_protocol.api.events import AgentRequest
from agentsd_protocol.errors import ForbiddenForAgents, InvalidParams, MethodNotFound
from agentsd_protocol.jsonrpc import RequestEnvelope, decode_params
from agentsd_protocol.methods import METHODS, Method

log = logging.getLogger(__name__)

Handler = Callable[[Call, Any], Awaitable[Any]]

HANDLERS: dict[str, Handler] = {
    **daemon_handlers.HANDLERS,
    **session_handlers.HANDLERS,
    **conversation_handlers.HANDLERS,
    **controls_handlers.HANDLERS,
    **queue_handlers.HANDLERS,
    **stream_handlers.HANDLERS,
    **attention_handlers.HANDLERS,
    **continuity_handlers.HANDLERS,
}

# Both tables in one lookup per request; a method is served when it is in both.
_ROUTES: dict[str, tuple[Method[Any, Any], Handler]] = {
    name: (method, HANDLERS[name]) for name, method in METHODS.items() if name in HANDLERS
}


async def dispatch(call: Call, envelope: RequestEnvelope) -> Any:
    """Decode the params for ``envelope.method`` and run its handler.

    Raises ``MethodNotFound`` (-32601), ``InvalidParams`` (-32602, with msgspec's
    JSON path) or whatever ``RpcError`` the handler raises.
    """
    route = _ROUTES.get(envelope.method)
    if route is None:
        raise MethodNotFound(f"Method not found: {envelope.method}")
    method, handler = route
    params = decode_params(envelope, method.params)
    caller = call.connection.caller
    if caller is not None and (method.mutation or method.name in POLICED_NON_MUTATIONS):
        await _police(call, method.name, params, caller)
    if not method.mutation:
        return await handler(call, params)
    op_id = getattr(params, "client_operation_id", None)
    if op_id is None:
        return await handler(call, params)
    if not op_id or len(op_id) > MAX_OPERATION_ID_CHARS:
        raise InvalidParams(
            f"Invalid params: clientOperationId must have 1 to {MAX_OPERATION_ID_CHARS} characters"
        )
    call.operation = Operation(
        op_id=op_id, method=method.name, fingerprint=fingerprint(method.name, params)
    )
    replay = not getattr(params, "retry_unknown", False)
    return await call.app.ledger.run(call.operation, lambda: handler(call, params), replay=replay)


async def _police(call: Call, method: str, params: Any, caller: str | Unidentified) -> None:
    """A request from inside session ``caller`` (``agentsd.caller`` Rule 2): journal
    it in that session, then raise ``ForbiddenForAgents`` if an agent may not make it.
    A caller session deleted meanwhile has no journal: the refusal stands alone. A
    caller that could not be identified has no session and no allowance: it is
    refused every user-only action, and each refusal is logged."""
    target = getattr(params, "session_id", None)
    sessions = call.app.supervisor.sessions
    target_session = sessions.get(target) if isinstance(target, str) else None
    created_by = None if target_session is None else target_session.row.created_by
    config = call.app.config
    if isinstance(caller, Unidentified):
        reason = refusal(method, params, None, (), created_by, config.limits)
        if reason is not None:
            log.warning(
                "refused %s to connection %d, which could not be identified: %s",
                method,
                call.connection.id,
                reason,
            )
            raise ForbiddenForAgents(
                f"refused: {reason} is not allowed to an agent, and this connection's"
                " caller could not be identified (it may be an agent's)",
                refused=reason,
                callerSessionId=None,
            )
        return
    reason = refusal(method, params, caller, config.agent_allowance, created_by, config.limits)
    session = sessions.get(caller)
    if session is not None:
        event = AgentRequest(
            method=method, target_session_id=target, allowed=reason is None, reason=reason
        )
        await session.journal.append([event])
    if reason is not None:
        raise ForbiddenForAgents(
            f"refused: {reason} is not allowed to an agent (session {caller})",
            refused=reason,
            callerSessionId=caller,
        )
