"""ACP ``session/request_permission`` as an approval, and a decision as its answer.

Sans-IO: ``read_permission`` turns a request's params into what the sink records
(``Ask``), or into the reason the request is answered ``cancelled`` at once;
``permission_answer`` is the response for a committed decision. The agent's option
ids are the approval's options; their names and ACP kinds are kept beside them.
"""

from __future__ import annotations

from typing import Any

import attrs

from agentsd.providers.codex_rpc import clip
from agentsd_protocol.api.events import ApprovalOption

CANCELLED: dict[str, Any] = {"outcome": {"outcome": "cancelled"}}
MAX_INPUT_CHARS = 2000  # of the tool's input shown in the approval's detail


@attrs.frozen
class Ask:
    """A permission request as the approval to record."""

    kind: str
    title: str
    detail: str
    options: list[str]
    option_details: list[ApprovalOption]
    item_id: str | None


def read_permission(params: dict[str, Any], agent_name: str) -> Ask | str:
    """The approval a request asks for; a string saying why it cannot be asked (it
    offers no option) otherwise."""
    options = params.get("options")
    valid = [
        o
        for o in (options if isinstance(options, list) else [])
        if isinstance(o, dict) and isinstance(o.get("optionId"), str)
    ]
    if not valid:
        return "it offers no options"
    tool = params.get("toolCall")
    tool = tool if isinstance(tool, dict) else {}
    title = tool.get("title")
    tool_id = tool.get("toolCallId")
    detail = "\n".join(
        f"{o['optionId']} ({o.get('kind', '?')}): {o.get('name', '')}" for o in valid
    )
    if tool.get("rawInput") is not None:
        detail += f"\ninput: {clip(tool['rawInput'], MAX_INPUT_CHARS)}"
    return Ask(
        kind=str(tool.get("kind") or "permission"),
        title=title if isinstance(title, str) and title else f"{agent_name} asks for permission",
        detail=detail,
        options=[o["optionId"] for o in valid],
        option_details=[
            ApprovalOption(
                option_id=o["optionId"],
                name=o["name"] if isinstance(o.get("name"), str) else None,
                kind=o["kind"] if isinstance(o.get("kind"), str) else None,
            )
            for o in valid
        ],
        item_id=tool_id if isinstance(tool_id, str) else None,
    )


def permission_answer(option_ids: tuple[str, ...], decision: str) -> dict[str, Any]:
    """The response for ``decision``: the option it names, else (``cancel``) cancelled."""
    if decision in option_ids:
        return {"outcome": {"outcome": "selected", "optionId": decision}}
    return CANCELLED
