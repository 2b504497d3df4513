"""A daemon session's controls (``agentSession.options`` and ``.commands``) as ACP
modes, session config options and available commands.

Rule 1 (modes): an ACP mode is what the agent may do without asking. Claude Code's
is its ``permissionMode`` (each choice a mode); Codex's is a preset of its
``approvalPolicy`` and ``sandbox``, as Zed's codex-acp shows them (``read-only``,
``auto``, ``full-access``), and a session set otherwise (from the CLI) shows as
``custom``, which changes nothing when chosen; an ACP agent's is its own ``mode``
option. A provider without any has no modes.

Rule 2 (config options): the mode again (category ``mode``: ACP says an editor
that reads config options uses them instead of ``modes``), the ``model`` (category
``model``) and the ``effort`` (``thought_level``), each a ``select`` over the
choices the daemon lists. An option not set shows the agent's default choice, or
``default`` when the agent names none; choosing ``default`` unsets it. A value the
session has but the choices lack is listed too, so the current value is always
one of the options.

Rule 3 (commands): every command ``agentSession.commands`` lists is an ACP
available command; a prompt that is ``/name args`` with a listed ``name`` runs
``agentSession.command`` instead of going to the agent as text.

Pure: no I/O, no trio.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from agentsctl.acp import schema as acp
from agentsd_protocol.api import controls as ctl

DEFAULT = "default"  # the config value that unsets an option (Rule 2)
CUSTOM = "custom"  # the Codex mode of a combination no preset has (Rule 1)


@attrs.frozen
class Preset:
    name: str
    description: str
    settings: Mapping[str, str]


# Codex's presets, as codex-acp names them (Rule 1).
CODEX_PRESETS: dict[str, Preset] = {
    "read-only": Preset(
        "Read Only",
        "Codex reads files; it asks before editing or running commands",
        {"approvalPolicy": "on-request", "sandbox": "read-only"},
    ),
    "auto": Preset(
        "Auto",
        "Codex edits and runs commands in the workspace; it asks before leaving it",
        {"approvalPolicy": "on-request", "sandbox": "workspace-write"},
    ),
    "full-access": Preset(
        "Full Access",
        "Codex edits files and runs commands anywhere without asking",
        {"approvalPolicy": "never", "sandbox": "danger-full-access"},
    ),
}
CODEX_DEFAULTS = {"approvalPolicy": "on-request", "sandbox": "workspace-write"}
_CONFIG_CATEGORIES = {"model": "model", "effort": "thought_level"}
_CONFIG_NAMES = {"mode": "Mode", "model": "Model", "effort": "Effort"}


class UnknownControl(ValueError):
    """A mode or config option this session does not have, or a value it cannot take."""


@attrs.frozen
class Controls:
    """One session's modes and config options, from its ``agentSession.options``."""

    options: dict[str, ctl.OptionInfo]

    @classmethod
    def of(cls, result: ctl.OptionsResult) -> Controls:
        return cls({o.key: o for o in result.options})

    # -- modes (Rule 1) ------------------------------------------------------------------

    def modes(self) -> acp.SessionModeState | None:
        if self._is_codex():
            current = self._codex_mode()
            modes = [
                acp.SessionMode(id=mode_id, name=p.name, description=p.description)
                for mode_id, p in CODEX_PRESETS.items()
            ]
            if current == CUSTOM:
                settings = ", ".join(f"{k}={v}" for k, v in sorted(self._codex_settings().items()))
                modes.append(acp.SessionMode(id=CUSTOM, name="Custom", description=settings))
            return acp.SessionModeState(current_mode_id=current, available_modes=modes)
        option = self._mode_option()
        if option is None:
            return None
        choices = _choices(option)
        return acp.SessionModeState(
            current_mode_id=_current(option),
            available_modes=[
                acp.SessionMode(id=c.value, name=c.name, description=c.description) for c in choices
            ],
        )

    def mode_changes(self, mode_id: str) -> dict[str, Any]:
        """The ``setOptions`` changes that select ``mode_id``."""
        if self._is_codex():
            if mode_id == CUSTOM and self._codex_mode() == CUSTOM:
                return {}
            preset = CODEX_PRESETS.get(mode_id)
            if preset is None:
                raise UnknownControl(
                    f"unknown mode {mode_id!r} (modes: {', '.join(CODEX_PRESETS)})"
                )
            return dict(preset.settings)
        option = self._mode_option()
        if option is None:
            raise UnknownControl("this session has no modes")
        return {option.key: self._value(option, mode_id)}

    def _is_codex(self) -> bool:
        return "approvalPolicy" in self.options and "sandbox" in self.options

    def _codex_settings(self) -> dict[str, Any]:
        return {
            key: default if self.options[key].value is None else self.options[key].value
            for key, default in CODEX_DEFAULTS.items()
        }

    def _codex_mode(self) -> str:
        settings = self._codex_settings()
        return next(
            (mode_id for mode_id, p in CODEX_PRESETS.items() if dict(p.settings) == settings),
            CUSTOM,
        )

    def _mode_option(self) -> ctl.OptionInfo | None:
        for key in ("permissionMode", "mode"):
            option = self.options.get(key)
            if option is not None and option.choices:
                return option
        return None

    # -- config options (Rule 2) --------------------------------------------------------

    def config_options(self) -> list[acp.ConfigOption]:
        configs: list[acp.ConfigOption] = []
        modes = self.modes()
        if modes is not None:
            configs.append(
                acp.ConfigOption(
                    id="mode",
                    name="Mode",
                    category="mode",
                    current_value=modes.current_mode_id,
                    options=[
                        acp.ConfigChoice(value=m.id, name=m.name, description=m.description)
                        for m in modes.available_modes
                    ],
                )
            )
        for key, category in _CONFIG_CATEGORIES.items():
            option = self.options.get(key)
            if option is None:
                continue
            configs.append(
                acp.ConfigOption(
                    id=key,
                    name=_CONFIG_NAMES[key],
                    category=category,
                    description=option.description,
                    current_value=_current(option),
                    options=_choices(option),
                )
            )
        return configs

    def models(self) -> acp.SessionModelState | None:
        """The model config option as the unstable ``models`` state."""
        option = self.options.get("model")
        if option is None:
            return None
        return acp.SessionModelState(
            current_model_id=_current(option),
            available_models=[
                acp.ModelInfo(model_id=c.value, name=c.name, description=c.description)
                for c in _choices(option)
            ],
        )

    def config_changes(self, config_id: str, value: str | bool) -> dict[str, Any]:
        """The ``setOptions`` changes that set config option ``config_id``."""
        if not isinstance(value, str):
            raise UnknownControl(f"config option {config_id!r} takes one of its values")
        if config_id == "mode":
            return self.mode_changes(value)
        option = self.options.get(config_id) if config_id in _CONFIG_CATEGORIES else None
        if option is None:
            known = ["mode"] * (self.modes() is not None) + [
                k for k in _CONFIG_CATEGORIES if k in self.options
            ]
            raise UnknownControl(f"unknown config option {config_id!r} (known: {', '.join(known)})")
        return {option.key: self._value(option, value)}

    def _value(self, option: ctl.OptionInfo, value: str) -> str | None:
        """What ``setOptions`` gets for choosing ``value`` (``default`` unsets)."""
        if value == DEFAULT and not any(c.value == DEFAULT for c in option.choices or ()):
            return None
        return value


def _current(option: ctl.OptionInfo) -> str:
    if option.value is not None:
        return str(option.value)
    chosen = next((c.value for c in option.choices or () if c.default), None)
    return chosen if chosen is not None else DEFAULT


def _choices(option: ctl.OptionInfo) -> list[acp.ConfigChoice]:
    choices = [
        acp.ConfigChoice(value=c.value, name=c.label or c.value, description=c.description)
        for c in option.choices or ()
    ]
    values = {c.value for c in choices}
    current = _current(option)
    if current not in values:  # the session's value, or the agent's unnamed default
        choices.insert(0, acp.ConfigChoice(value=current, name=current))
    return choices


# -- commands (Rule 3) -------------------------------------------------------------------


def available_commands(result: ctl.CommandsResult) -> list[acp.AvailableCommand]:
    return [
        acp.AvailableCommand(
            name=command.name,
            description=command.description or command.name,
            input=acp.CommandInput(hint=command.hint) if command.hint else None,
        )
        for command in result.commands
    ]


def slash_command(text: str, names: set[str]) -> tuple[str, str | None] | None:
    """``(name, args)`` when ``text`` runs a listed command (Rule 3), else None."""
    if not text.startswith("/"):
        return None
    words = text[1:].split(maxsplit=1)
    if not words or words[0] not in names:
        return None
    return words[0], words[1].strip() if len(words) > 1 else None
