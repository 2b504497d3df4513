"""Wire types for talking to the agent: send, interrupt, respond, setOptions."""

from __future__ import annotations

from typing import Any, Literal

from agentsd_protocol.api.base import MutationParams, Result
from agentsd_protocol.api.session import SessionInfo

DispatchOutcome = Literal["accepted", "rejected", "unknown"]


class SendParams(MutationParams, frozen=True, kw_only=True):
    session_id: str
    text: str
    retry_unknown: bool = False  # with clientOperationId: re-deliver a durably unknown submission


class SendResult(Result, frozen=True, kw_only=True):
    client_message_id: str
    seq: int
    dispatch: DispatchOutcome
    reason: str | None = None
    turn_id: str | None = None


class InterruptParams(MutationParams, frozen=True, kw_only=True):
    session_id: str
    turn_id: str | None = None


class InterruptResult(Result, frozen=True, kw_only=True):
    interrupted: bool
    reason: str | None = None  # why nothing was interrupted


class RespondParams(MutationParams, frozen=True, kw_only=True):
    session_id: str
    approval_id: str
    decision: str


class RespondResult(Result, frozen=True, kw_only=True):
    approval_id: str
    decision: str
    seq: int


class SetOptionsParams(MutationParams, frozen=True, kw_only=True):
    session_id: str
    title: str | None = None
    options: dict[str, Any] | None = None  # replaces the options; used at the next start


class SetOptionsResult(Result, frozen=True, kw_only=True):
    session: SessionInfo
