"""A ``SessionSink`` for driving a provider adapter without a daemon: it keeps what
the adapter reports, and can refuse approvals as a full disk would."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentsd_protocol.api.events import ApprovalOption, Event, body_fields, kind_of
from agentsd_protocol.errors import StorageUnavailable


class RecordingSink:
    """Keeps events (kind and body, by their wire names), deltas, approvals (one dict
    each, by their wire names),
    withdrawn approvals and option changes; ``refuse_approvals`` makes recording an
    approval fail with ``StorageUnavailable``."""

    def __init__(self, *, refuse_approvals: bool = False) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.deltas: list[tuple[str, str]] = []
        self.approvals: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self.option_changes: list[dict[str, Any]] = []
        self.refuse_approvals = refuse_approvals

    async def emit(self, event: Event) -> int:
        self.events.append((kind_of(event), body_fields(event)))
        return len(self.events)

    def delta(self, item_id: str, text: str) -> None:
        self.deltas.append((item_id, text))

    async def approval_requested(
        self,
        native_id: str,
        kind: str,
        title: str,
        detail: str,
        options: list[str],
        *,
        item_id: str | None = None,
        option_details: list[ApprovalOption] | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> str:
        if self.refuse_approvals:
            raise StorageUnavailable("the disk is full")
        self.approvals.append(
            {
                "nativeId": native_id,
                "kind": kind,
                "title": title,
                "detail": detail,
                "options": options,
                "itemId": item_id,
                "optionDetails": option_details,
                "request": request,
            }
        )
        return f"ap-{native_id}"

    async def approval_cancelled(self, native_id: str) -> None:
        self.cancelled.append(native_id)

    async def options_changed(self, changes: Mapping[str, Any]) -> None:
        self.option_changes.append(dict(changes))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    def approval_fields(self, *names: str) -> list[dict[str, Any]]:
        """The approvals recorded, with only the fields ``names``."""
        return [{name: approval[name] for name in names} for approval in self.approvals]
