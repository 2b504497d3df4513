"""Base classes for every wire type.

Evolution rules (msgspec's): a new field always gets a default; a field's type never
changes; a removed field's name is never reused. Inbound params refuse unknown fields
so a typo fails loudly instead of being ignored.
"""

from __future__ import annotations

import msgspec


class Params(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    """Inbound params of a method."""


class MutationParams(Params, frozen=True, kw_only=True):
    """Params of a method that changes state.

    ``client_operation_id`` makes a retry safe: the same id with the same params
    replays the recorded answer. ``expected_fence`` fails the call with
    ``stale_fence`` unless it matches the session's current fence.
    """

    client_operation_id: str | None = None
    expected_fence: int | None = None


class Result(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Outbound result of a method or params of a notification."""


class Empty(Params, frozen=True, kw_only=True):
    """Params of a method that takes none."""
