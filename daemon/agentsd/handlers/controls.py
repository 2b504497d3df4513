"""``agentSession.options/setOptions/commands/command``: the conversation's controls.

Rule 1 (nothing half-changed): ``setOptions`` checks every changed option (known
key, a value within a closed option's choices, what the agent could start with)
before anything happens; then applies the live ones to the running agent; then
journals the new options. A refusal at any step leaves the options as they were,
durably and in the agent (a change the agent already took before a later one was
refused is undone only by the next start: the journal never claims it).

Rule 2 (one at a time): option changes and commands run under the session's
``controls_lock``: two clients setting different keys both win (each merges over
the other's), and of two commands sent together the second finds the first's turn
running.

Rule 3: a command runs only in an idle conversation (no turn, nothing undelivered):
a compaction or a ``/command`` in the middle of a turn would be a steer the user did
not ask for. ``command.run`` is journaled before the agent sees it.

Rule 4 (``clear``): the agent is stopped, the marker ``conversation.cleared`` is
journaled with the provider handle unset, and the agent is started blank: a fresh
Codex thread, Claude Code session or mock conversation. The journal before the
marker stays readable; resume never reaches back past it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from agentsd.providers.base import Adapter, Dispatch, OptionSpec
from agentsd_protocol.api import controls as api
from agentsd_protocol.api import conversation as capi
from agentsd_protocol.api.events import CommandRun, ConversationCleared, SessionUpdated
from agentsd_protocol.api.session import MAX_OPTIONS_BYTES
from agentsd_protocol.display import excerpt
from agentsd_protocol.errors import (
    InvalidParams,
    InvalidState,
    RpcError,
    UnknownCommand,
    UnknownOption,
)

if TYPE_CHECKING:
    from agentsd.connection import Call
    from agentsd.session import Session
    from agentsd.supervisor import Supervisor

log = logging.getLogger(__name__)
_encoder = msgspec.json.Encoder()

MAX_TITLE_CHARS = 500  # a status-bar label, not a document
COMPACT = api.CommandInfo(
    name="compact",
    description="summarize the conversation so far to free context",
    source="agentsd",
)
CLEAR = api.CommandInfo(
    name="clear",
    description="start a fresh conversation in this session (history stays readable)",
    source="agentsd",
)
OWN_COMMANDS = (COMPACT, CLEAR)


async def _offered(adapter: Adapter | None) -> Mapping[str, list[api.OptionChoice]]:
    """The running agent's choices; none when it cannot say (it is stopping, or a
    release without a model list): the provider's own choices stand in."""
    if adapter is None:
        return {}
    try:
        return await adapter.option_choices()
    except RpcError as exc:
        log.info("the agent could not list its choices: %s", exc.message)
        return {}


def _adapter(session: Session) -> Adapter | None:
    task = session.task
    return None if task is None else task.adapter


def check_title(title: str | None) -> None:
    if title is not None and len(title) > MAX_TITLE_CHARS:
        raise InvalidParams(
            f"Invalid params: title longer than {MAX_TITLE_CHARS} characters "
            f"({excerpt(title, 40)})",
            limit="title",
        )


# -- options -----------------------------------------------------------------------


async def handle_options(call: Call, params: api.OptionsParams) -> api.OptionsResult:
    """The provider's options with the session's values; the running agent is asked
    for its choices (models, efforts)."""
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id)
    provider = supervisor.provider(session.row.provider)
    adapter = _adapter(session)
    offered = await _offered(adapter)
    specs = provider.option_specs() or {}
    values = session.row.options
    options = [
        api.OptionInfo(
            key=key,
            value=values.get(key),
            choices=_choices(spec, offered.get(key)),
            open=spec.open,
            applies_at=spec.applies_at if adapter is not None else "nextStart",
            description=spec.description,
        )
        for key, spec in specs.items()
    ]
    # Options the session has that the provider does not declare (an ACP agent's).
    options += [
        api.OptionInfo(key=key, value=value, applies_at="nextStart")
        for key, value in values.items()
        if key not in specs
    ]
    return api.OptionsResult(
        session_id=session.id,
        provider=session.row.provider,
        running=adapter is not None,
        options=options,
    )


def _choices(
    spec: OptionSpec, offered: list[api.OptionChoice] | None
) -> list[api.OptionChoice] | None:
    if offered:
        return offered
    if spec.choices is None:
        return None
    return [api.OptionChoice(value=value) for value in spec.choices]


def _check_changes(
    specs: Mapping[str, OptionSpec] | None,
    changes: Mapping[str, Any],
    offered: Mapping[str, list[api.OptionChoice]],
) -> None:
    """``UnknownOption`` for the first (sorted) changed key the provider does not
    have, or value outside a closed option's choices (Rule 1)."""
    if specs is None:
        return
    for key in sorted(changes):
        spec = specs.get(key)
        if spec is None:
            raise UnknownOption(
                f"unknown option {excerpt(key, 60)} for this provider "
                f"(known: {', '.join(sorted(specs))})",
                option=key,
                known=sorted(specs),
            )
        value = changes[key]
        if value is None or spec.open:
            continue
        choices = [c.value for c in offered.get(key) or []] or list(spec.choices or ())
        if value not in choices:
            raise UnknownOption(
                f"option {key!r} cannot be {excerpt(str(value), 60)} "
                f"(choices: {', '.join(choices)})",
                option=key,
                value=value,
                choices=choices,
            )


async def handle_set_options(call: Call, params: capi.SetOptionsParams) -> capi.SetOptionsResult:
    """Rules 1 and 2. ``options`` replaces, ``changes`` merges (null unsets)."""
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    check_title(params.title)
    if params.options is not None and params.changes is not None:
        raise InvalidParams("Invalid params: give options (all of them) or changes, not both")
    async with session.controls_lock:
        return await _set_options(supervisor, session, params)


async def _set_options(
    supervisor: Supervisor, session: Session, params: capi.SetOptionsParams
) -> capi.SetOptionsResult:
    old = session.row.options
    new: dict[str, Any] | None = None
    if params.options is not None:
        new = dict(params.options)
    elif params.changes is not None:
        new = {k: v for k, v in {**old, **params.changes}.items() if v is not None}
    if new is not None and len(_encoder.encode(new)) > MAX_OPTIONS_BYTES:
        raise InvalidParams(
            f"Invalid params: options are more than {MAX_OPTIONS_BYTES} bytes as JSON",
            limit="options",
            maxBytes=MAX_OPTIONS_BYTES,
        )
    changed = {} if new is None else _changed(old, new)
    applies_at: dict[str, api.AppliesAt] = {}
    if changed:
        provider = supervisor.provider(session.row.provider)
        specs = provider.option_specs()
        adapter = _adapter(session)
        offered = await _offered(adapter)
        _check_changes(specs, changed, offered)
        assert new is not None
        provider.check_options(new)
        live = {
            key: value
            for key, value in changed.items()
            if adapter is not None
            and value is not None
            and specs is not None
            and specs[key].applies_at != "nextStart"
        }
        if adapter is not None and live:
            await adapter.apply_options(live)
        for key in changed:
            applies_at[key] = specs[key].applies_at if key in live and specs else "nextStart"
    fields: dict[str, Any] = {}
    if params.title is not None:
        fields["title"] = params.title
    if new is not None:
        fields["options"] = new
    if fields:
        updated = SessionUpdated(title=params.title, options=new)
        await session.journal.append([updated], **fields)
    return capi.SetOptionsResult(session=session.info(), applies_at=applies_at)


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Each key whose value differs, with its new value (None: unset)."""
    return {key: new.get(key) for key in {*old, *new} if old.get(key) != new.get(key)}


# -- commands ----------------------------------------------------------------------


async def handle_commands(call: Call, params: api.CommandsParams) -> api.CommandsResult:
    session = call.app.supervisor.get(params.session_id)
    adapter = _adapter(session)
    commands = list(OWN_COMMANDS)
    if adapter is not None:
        offered = await adapter.agent_commands()
        if not adapter.supports_compact:
            # Its own compact, if it offers one, is the only compaction there is.
            commands = [CLEAR]
        own = {c.name for c in commands}
        commands += [
            api.CommandInfo(name=c.name, description=c.description, hint=c.hint, source="agent")
            for c in offered
            if c.name not in own
        ]
    return api.CommandsResult(session_id=session.id, running=adapter is not None, commands=commands)


async def handle_command(call: Call, params: api.CommandParams) -> api.CommandResult:
    """Rules 3 and 4. Raises ``UnknownCommand`` (nothing journaled) for a name
    neither agentsd nor the agent offers, ``InvalidState`` while a turn runs,
    ``Draining`` while the daemon drains."""
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    name = params.name.removeprefix("/")
    if params.args is not None and len(params.args.encode()) > api.MAX_COMMAND_ARGS_BYTES:
        raise InvalidParams(f"Invalid params: args longer than {api.MAX_COMMAND_ARGS_BYTES} bytes")
    _check_idle(session, name)
    # A command starts a turn (or a new thread): a draining daemon takes none
    # (agentsd.drain Rule 1), refused before anything is journaled.
    with supervisor.gate.admit():
        async with session.controls_lock:
            return await _command(call, session, name, params.args)


async def _command(call: Call, session: Session, name: str, args: str | None) -> api.CommandResult:
    supervisor = call.app.supervisor
    _check_idle(session, name)
    if name == CLEAR.name:
        return await _clear(call, session)
    await supervisor.start(session)
    adapter = _adapter(session)
    if adapter is None:
        raise InvalidState("the agent stopped before the command could run")
    native = name == COMPACT.name and adapter.supports_compact
    if not native:
        offered = [c.name for c in await adapter.agent_commands()]
        if name not in offered:
            known = sorted(
                {CLEAR.name, *offered, *([COMPACT.name] if adapter.supports_compact else [])}
            )
            raise UnknownCommand(
                f"unknown command {excerpt(name, 60)} (known: {', '.join(known)})",
                name=name,
                known=known,
            )
    _check_idle(session, name)
    stored = await session.journal.append([_command_run(call, name, args)])
    dispatch = await adapter.compact() if native else await adapter.run_command(name, args)
    if session.task is not None:
        session.task.touch()
    return _result(name, stored[0].seq, dispatch)


def _check_idle(session: Session, name: str) -> None:
    convo = session.conversation
    if convo.turn_open or convo.undispatched:
        raise InvalidState(
            f"a turn is running: {name} runs in an idle conversation (interrupt the turn "
            "or wait for its end)"
        )


def _command_run(call: Call, name: str, args: str | None) -> CommandRun:
    operation = call.operation
    return CommandRun(
        name=name, args=args, operation_id=None if operation is None else operation.op_id
    )


def _result(name: str, seq: int, dispatch: Dispatch) -> api.CommandResult:
    return api.CommandResult(
        name=name,
        seq=seq,
        dispatch=dispatch.outcome,
        reason=dispatch.reason,
        turn_id=dispatch.turn_id,
    )


async def _clear(call: Call, session: Session) -> api.CommandResult:
    """Rule 4."""
    supervisor = call.app.supervisor
    await supervisor.close(session)
    _check_idle(session, CLEAR.name)
    marker = ConversationCleared(previous_handle=session.row.provider_handle)
    stored = await session.journal.append(
        [_command_run(call, CLEAR.name, None), marker], provider_handle=None
    )
    await supervisor.start(session)
    return api.CommandResult(
        name=CLEAR.name,
        seq=stored[0].seq,
        dispatch="accepted",
        handle=session.row.provider_handle,
    )


HANDLERS: dict[str, Any] = {
    "agentSession.options": handle_options,
    "agentSession.setOptions": handle_set_options,
    "agentSession.commands": handle_commands,
    "agentSession.command": handle_command,
}
