"""The error taxonomy shared by the daemon and every client.

Rule 1: every error on the wire is an ``RpcError`` subclass, chosen by its class-level
``code``; ``data.kind`` is a stable string clients switch on and ``data.retryable``
says whether the same request may succeed later unchanged.

Rule 2: the mapping from exception to wire happens in exactly one place
(``RpcError.to_wire``) and back in exactly one place (``error_from_wire``), so a client
catches the same class the daemon raised.

Rule 3: no traceback or repr of a foreign exception ever reaches the wire; unexpected
failures become ``InternalError`` with a generic message.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec


class ErrorObject(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The JSON-RPC 2.0 error member."""

    code: int
    message: str
    data: dict[str, Any] | None = None


class RpcError(Exception):
    """Base of every error that crosses the wire.

    ``details`` become extra members of ``data`` next to ``kind`` and ``retryable``
    (for example ``currentFence`` on ``StaleFence``).
    """

    code: ClassVar[int] = -32603
    kind: ClassVar[str] = "internal"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_wire(self) -> ErrorObject:
        data: dict[str, Any] = {"kind": self.kind, "retryable": self.retryable}
        data.update(self.details)
        return ErrorObject(code=self.code, message=self.message, data=data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, {self.details!r})"


# The five codes of the JSON-RPC 2.0 specification.


class ParseError(RpcError):
    code = -32700
    kind = "parse_error"


class InvalidRequest(RpcError):
    code = -32600
    kind = "invalid_request"


class MethodNotFound(RpcError):
    code = -32601
    kind = "method_not_found"


class InvalidParams(RpcError):
    code = -32602
    kind = "invalid_params"


class InternalError(RpcError):
    code = -32603
    kind = "internal"


# Application errors, -32000..-32099. Codes are never reused or renumbered.


class FrameTooLarge(RpcError):
    code = -32000
    kind = "frame_too_large"


class ShuttingDown(RpcError):
    code = -32001
    kind = "shutting_down"
    retryable = True


class SessionNotFound(RpcError):
    code = -32002
    kind = "session_not_found"


class StaleFence(RpcError):
    code = -32003
    kind = "stale_fence"


class OperationConflict(RpcError):
    code = -32004
    kind = "operation_conflict"


class AlreadyResolved(RpcError):
    code = -32005
    kind = "already_resolved"


class UnknownProvider(RpcError):
    code = -32006
    kind = "unknown_provider"


class CwdNotFound(RpcError):
    code = -32007
    kind = "cwd_not_found"


class CwdNotDirectory(RpcError):
    code = -32008
    kind = "cwd_not_directory"


class StorageUnavailable(RpcError):
    code = -32009
    kind = "storage_unavailable"
    retryable = True


class InvalidState(RpcError):
    """The session is in a state where the request cannot be honoured (for example a
    session being deleted)."""

    code = -32010
    kind = "invalid_state"
    retryable = True


class ExitUnproven(RpcError):
    """The agent child could not be proven gone; its lease stays held."""

    code = -32011
    kind = "exit_unproven"
    retryable = True


class AgentStartFailed(RpcError):
    """The agent child could not be started or did not complete its handshake."""

    code = -32012
    kind = "agent_start_failed"
    retryable = True


class OperationLedgerFull(RpcError):
    code = -32013
    kind = "operation_ledger_full"
    retryable = True


class ApprovalNotFound(RpcError):
    code = -32014
    kind = "approval_not_found"


class SubscriptionNotFound(RpcError):
    code = -32015
    kind = "subscription_not_found"


class AgentNotRunning(RpcError):
    code = -32016
    kind = "agent_not_running"
    retryable = True


class Overloaded(RpcError):
    code = -32017
    kind = "overloaded"
    retryable = True


class UnsupportedSchema(RpcError):
    code = -32018
    kind = "unsupported_schema"


class AgentNotFound(RpcError):
    """The agent's program is not installed (the message says how to install it)."""

    code = -32019
    kind = "agent_not_found"


class HandshakeTimeout(RpcError):
    code = -32020
    kind = "handshake_timeout"
    retryable = True


class AgentProtocolError(RpcError):
    """The agent wrote something its protocol does not allow."""

    code = -32021
    kind = "agent_protocol_error"


class AgentExited(RpcError):
    """The agent exited before it was ready."""

    code = -32022
    kind = "agent_exited"
    retryable = True


class AgentUnsupported(RpcError):
    """The agent's program is a version agentsd cannot speak to (the message names
    the version found and the oldest supported)."""

    code = -32023
    kind = "agent_unsupported"


class ResumeFailed(RpcError):
    """A conversation that had turns could not be resumed: the message carries the
    agent's own words. agentsd never starts a fresh conversation in its place."""

    code = -32024
    kind = "resume_failed"


class PromptNotQueued(RpcError):
    """The queued prompt is gone (sent or withdrawn) or another client is acting on
    it right now: each queued prompt has one fate."""

    code = -32025
    kind = "prompt_not_queued"


class ForbiddenForAgents(RpcError):
    """The request came from inside a session (one of the daemon's own agents) and
    asks for what an agent must not do to its user: answer an approval, close,
    delete or change another session, shut the daemon down. ``refused`` says what,
    ``callerSessionId`` whose agent asked; the config's ``agent_allowance`` lifts it."""

    code = -32040
    kind = "forbidden_for_agents"


class LimitUnavailable(RpcError):
    """A configured limit (memory, pids, cpu) cannot be applied to the agent: there
    is no cgroup, or its controller is not enabled in the cgroup root. Never a
    silent no-op: the create or start fails, naming the limit and what is missing."""

    code = -32041
    kind = "limit_unavailable"


class UnknownOption(RpcError):
    """``setOptions`` named an option the session's provider does not have, or a
    value outside an option's closed choices (``option``, ``value``, ``choices``);
    nothing was changed."""

    code = -32046
    kind = "unknown_option"


class UnknownCommand(RpcError):
    """``agentSession.command`` named a command neither agentsd nor the session's
    agent offers (``name``, ``known``); nothing was run or journaled."""

    code = -32047
    kind = "unknown_command"


class NotCutOff(RpcError):
    """``agentSession.continue`` of a session whose last turn was not cut off by a
    daemon restart (it finished, failed, was interrupted by the user, or a prompt
    was sent since): there is nothing to carry on."""

    code = -32048
    kind = "not_cut_off"


class Draining(RpcError):
    """The daemon is draining before a restart (``daemon.restart`` with ``drain``):
    it takes no new turn. Retry once it has restarted."""

    code = -32049
    kind = "draining"
    retryable = True


class ContentUnsupported(RpcError):
    """The prompt carries a content block (an image, a file reference) the session's
    agent cannot take. Refused before anything is journaled; ``block`` names the
    block's type and ``provider`` the agent."""

    code = -32050
    kind = "content_unsupported"


class AttachmentRefused(RpcError):
    """An image or file of a prompt cannot be used: missing, not a regular file, in
    a place the daemon does not read from, past its size bound, or not an image of a
    known type. Refused before anything is journaled; ``reason`` is a stable word
    (``not_found``, ``not_regular``, ``forbidden_path``, ``too_large``,
    ``not_an_image``, ``bad_base64``, ``too_many``, ``quota``: the session keeps as
    many image bytes as it may), ``limit`` the bound when one was passed."""

    code = -32051
    kind = "attachment_refused"


class ConversationInUse(RpcError):
    """``create {resumeFrom}`` names a conversation a stored session already holds
    (``sessionId``): two agents on one conversation would interleave their turns in
    it. Refused before anything is stored. (Code -32060: past the block other
    errors are being added in.)"""

    code = -32060
    kind = "conversation_in_use"


class RestartRefused(RpcError):
    """``daemon.restart`` found that the new version installed would not start (it
    cannot load the configuration or its own code: ``output`` has what it said), so
    nothing was stopped, drained or handed over: the daemon serves on as it was. Fix
    the install or the configuration, then restart again. (Code -32066: past the
    block other errors are being added in.)"""

    code = -32066
    kind = "restart_refused"


def _all_subclasses(cls: type[RpcError]) -> list[type[RpcError]]:
    out: list[type[RpcError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def error_classes() -> dict[int, type[RpcError]]:
    """Every error class by its code (built on demand so late subclasses count)."""
    table: dict[int, type[RpcError]] = {}
    for cls in _all_subclasses(RpcError):
        if cls.code in table and table[cls.code] is not cls:
            raise AssertionError(f"error code {cls.code} used twice")
        table[cls.code] = cls
    return table


def error_from_wire(error: ErrorObject) -> RpcError:
    """Rebuild the exception the daemon raised from its wire form."""
    cls = error_classes().get(error.code, RpcError)
    details = dict(error.data or {})
    details.pop("kind", None)
    details.pop("retryable", None)
    exc = cls(error.message, **details)
    if cls is RpcError:
        # An error this client does not know yet: keep the code and kind it carried.
        exc.code = error.code  # type: ignore[misc]
        exc.kind = str((error.data or {}).get("kind", "unknown"))  # type: ignore[misc]
    return exc
