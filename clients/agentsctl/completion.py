"""``agentsctl completion bash|zsh|fish``: shell completion scripts, generated from
the parser that ``agentsctl.cli.COMMANDS`` builds, so they never drift from it.

Rule 1: the scripts complete commands, group verbs, each command's options, option
values (files, directories, choices, providers) and session ids.

Rule 2: session ids come from ``agentsctl --no-start ls --json``, and provider names
from ``agentsctl providers`` (the daemon's, with its config's ``[agents.NAME]``; the
built-in ones when no daemon answers), run quietly (stderr discarded, and never
starting a daemon from a TAB press), with the ``--socket`` and ``--state-dir``
already typed passed along; no daemon means no ids, never an error. Should
``agentsctl`` itself not run, providers fall back to the built-in names written into
the script. The same way, ``set``'s ``KEY=`` come from ``options SESSION --json``
and ``command``'s names from ``commands SESSION --json``, SESSION being the first
positional typed.

zsh uses the bash script through its own ``bashcompinit`` (zsh's bash emulation
runs it with bash's 0-based arrays); fish gets ``complete`` rules of its own.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import msgspec

from agentsctl.cli import COMMANDS, EXIT_OK, GROUPS, build_parser
from agentsd_protocol.providers import builtin_provider_names

if TYPE_CHECKING:
    from agentsctl.target import Target

SHELLS = ("bash", "zsh", "fish")


class Option(msgspec.Struct, frozen=True):
    flags: list[str]
    value: str | None  # None: a flag; else what completes its value (see _kind)
    help: str


class CommandSpec(msgspec.Struct, frozen=True):
    """One command path (``status``, ``daemon stop``; ``""`` for the global options)."""

    path: str
    summary: str
    options: list[Option]
    positionals: list[str]  # what completes each positional, in order
    repeats: bool = False  # the last positional takes any number of words


def configure_completion(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, help="the shell to print the script for")


def run_completion(args: argparse.Namespace, target: Target) -> int:
    """Print the script; it needs no daemon."""
    script = {"bash": bash_script, "zsh": zsh_script, "fish": fish_script}[args.shell]()
    sys.stdout.write(script)
    return EXIT_OK


# -- the model ----------------------------------------------------------------------


def _kind(action: argparse.Action) -> str:
    """What completes an argument: ``session``, ``provider``, ``file``, ``dir``,
    ``choices A B``, ``option`` (a session's option keys), ``command`` (a session's
    command names), or ``none`` (free text)."""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return "choices " + " ".join(str(c) for c in action.choices)
    if action.dest == "session_id":
        return "session"
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    if metavar == "DIR":
        return "dir"
    if metavar in ("PATH", "FILE"):
        return "file"
    if metavar == "PROVIDER":
        return "provider"
    if metavar == "KEY=VALUE":
        return "option"
    if metavar == "COMMAND":
        return "command"
    return "none"


def _spec(path: str, summary: str, parser: argparse.ArgumentParser) -> CommandSpec:
    options: list[Option] = []
    positionals: list[str] = []
    repeats = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            value = None if action.nargs == 0 else _kind(action)
            options.append(Option(list(action.option_strings), value, action.help or ""))
        else:
            positionals.append(_kind(action))
            repeats = action.nargs in ("+", "*")
    return CommandSpec(path, summary, options, positionals, repeats)


def command_specs() -> list[CommandSpec]:
    """The global options (path ``""``) and every command, from the whole parser."""
    parser = build_parser()
    specs = [_spec("", "", parser)]
    summaries = {c.name: c.summary for c in COMMANDS}
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            if name in GROUPS:
                for inner in sub._actions:
                    if isinstance(inner, argparse._SubParsersAction):
                        for verb, verb_parser in inner.choices.items():
                            path = f"{name} {verb}"
                            specs.append(_spec(path, summaries.get(path, ""), verb_parser))
            else:
                specs.append(_spec(name, summaries.get(name, ""), sub))
    return specs


def _top_words() -> list[tuple[str, str]]:
    """(word, summary) for each top-level command and group, in table order."""
    words: dict[str, str] = {}
    for command in COMMANDS:
        first = command.name.partition(" ")[0]
        words.setdefault(first, GROUPS.get(first, command.summary))
    return list(words.items())


def _verbs(group: str) -> list[tuple[str, str]]:
    return [
        (c.name.partition(" ")[2], c.summary)
        for c in COMMANDS
        if c.name.partition(" ")[0] == group and " " in c.name
    ]


# -- bash (and zsh) -----------------------------------------------------------------


def _bash_repeats(rows: list[tuple[str, str]]) -> str:
    """The fallback of ``_agentsctl_positional``: a nested case over the commands
    whose last positional repeats (their patterns end in an unquoted ``*``)."""
    if not rows:
        return "return 1"
    cases = " ".join(f'"{key}) echo "{value}" ;;' for key, value in rows)
    return f'case "$1|$2" in {cases} *) return 1 ;; esac'


def _bash_case(rows: list[tuple[str, str]], default: str = "return 1") -> str:
    lines = [f'        "{key}") echo "{value}" ;;' for key, value in rows]
    lines.append(f"        *) {default} ;;")
    return "\n".join(lines)


def bash_body() -> str:
    """The functions and the ``complete`` line: valid bash, and zsh under bashcompinit."""
    specs = command_specs()
    values = [
        (f"{spec.path}|{flag}", option.value)
        for spec in specs
        for option in spec.options
        if option.value is not None
        for flag in option.flags
    ]
    options = [(spec.path, " ".join(f for o in spec.options for f in o.flags)) for spec in specs]
    positionals = [
        (f"{spec.path}|{index}", kind)
        for spec in specs
        for index, kind in enumerate(spec.positionals)
        if kind != "none"
    ]
    # A positional taking any number of words completes every later one the same way.
    repeated = [
        (f'{spec.path}|"*', spec.positionals[-1])
        for spec in specs
        if spec.repeats and spec.positionals and spec.positionals[-1] != "none"
    ]
    verbs = [(group, " ".join(v for v, _ in _verbs(group))) for group in GROUPS]
    commands = " ".join(word for word, _ in _top_words())
    builtin = " ".join(builtin_provider_names())
    return f"""\
_agentsctl_sessions() {{
    # Session ids, quietly: no daemon (or no agentsctl) means none.
    command agentsctl "$@" --no-start ls --json 2>/dev/null |
        sed -n 's/^[[:space:]]*"sessionId":[[:space:]]*"\\([^"]*\\)".*/\\1/p'
}}

_agentsctl_providers() {{
    # Provider names, quietly: the daemon's, or the built-in ones.
    command agentsctl "$@" --no-start providers 2>/dev/null || echo "{builtin}"
}}

_agentsctl_listed() {{  # $1 what (options|commands), $2 field, $3 session, globals after
    local what=$1 field=$2 session=$3
    shift 3
    [[ -n $session ]] || return 0
    command agentsctl "$@" --no-start "$what" "$session" --json 2>/dev/null |
        sed -n 's/^[[:space:]]*"'"$field"'":[[:space:]]*"\\([^"]*\\)".*/\\1/p'
}}

_agentsctl_value() {{  # $1 command path ("" for global options), $2 option: its value kind
    case "$1|$2" in
{_bash_case(values)}
    esac
}}

_agentsctl_options() {{  # $1 command path: its options
    case "$1" in
{_bash_case(options, "echo")}
    esac
}}

_agentsctl_positional() {{  # $1 command path, $2 index: what completes that positional
    case "$1|$2" in
{_bash_case(positionals, _bash_repeats(repeated))}
    esac
}}

_agentsctl_verbs() {{  # $1 group: its verbs
    case "$1" in
{_bash_case(verbs)}
    esac
}}

_agentsctl_complete_kind() {{  # $1 kind, $2 the word being completed
    case "$1" in
        session) COMPREPLY=($(compgen -W "$(_agentsctl_sessions "${{_agentsctl_globals[@]}}")" -- "$2")) ;;
        provider) COMPREPLY=($(compgen -W "$(_agentsctl_providers "${{_agentsctl_globals[@]}}")" -- "$2")) ;;
        file) local IFS=$'\\n'; COMPREPLY=($(compgen -f -- "$2")); compopt -o filenames 2>/dev/null ;;
        dir) local IFS=$'\\n'; COMPREPLY=($(compgen -d -- "$2")); compopt -o filenames 2>/dev/null ;;
        choices\\ *) COMPREPLY=($(compgen -W "${{1#choices }}" -- "$2")) ;;
        option)
            COMPREPLY=($(compgen -S = -W "$(_agentsctl_listed options key "$_agentsctl_pos0" "${{_agentsctl_globals[@]}}")" -- "$2"))
            compopt -o nospace 2>/dev/null ;;
        command) COMPREPLY=($(compgen -W "$(_agentsctl_listed commands name "$_agentsctl_pos0" "${{_agentsctl_globals[@]}}")" -- "$2")) ;;
    esac
}}

_agentsctl() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" cmd="" word kind verbs i=1 npos=0
    local -a _agentsctl_globals=()
    local _agentsctl_pos0=""
    COMPREPLY=()
    while (( i < COMP_CWORD )); do
        word="${{COMP_WORDS[i]}}"
        if [[ $word == -* ]]; then
            if kind=$(_agentsctl_value "$cmd" "$word"); then
                if (( i + 1 == COMP_CWORD )); then
                    _agentsctl_complete_kind "$kind" "$cur"
                    return 0
                fi
                [[ -z $cmd ]] && _agentsctl_globals+=("$word" "${{COMP_WORDS[i+1]}}")
                (( i += 2 ))
                continue
            fi
        elif [[ -z $cmd ]]; then
            cmd=$word
        elif _agentsctl_verbs "$cmd" >/dev/null; then
            cmd="$cmd $word"
        else
            (( npos == 0 )) && _agentsctl_pos0=$word
            (( npos += 1 ))
        fi
        (( i += 1 ))
    done
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_agentsctl_options "$cmd")" -- "$cur"))
    elif [[ -z $cmd ]]; then
        COMPREPLY=($(compgen -W "{commands}" -- "$cur"))
    elif verbs=$(_agentsctl_verbs "$cmd"); then
        COMPREPLY=($(compgen -W "$verbs" -- "$cur"))
    elif kind=$(_agentsctl_positional "$cmd" "$npos"); then
        _agentsctl_complete_kind "$kind" "$cur"
    fi
    return 0
}}

complete -F _agentsctl agentsctl
"""


def bash_script() -> str:
    return (
        "# bash completion for agentsctl, generated by `agentsctl completion bash`.\n"
        "# Load it with: source <(agentsctl completion bash)\n\n" + bash_body()
    )


def zsh_script() -> str:
    return (
        "#compdef agentsctl\n"
        "# zsh completion for agentsctl, generated by `agentsctl completion zsh`: the bash\n"
        "# completion through zsh's bashcompinit. Load it with:\n"
        "#   source <(agentsctl completion zsh)\n\n"
        "autoload -U +X compinit && { (( ${+_comps} )) || compinit }\n"
        "autoload -U +X bashcompinit && bashcompinit\n\n" + bash_body()
    )


# -- fish ----------------------------------------------------------------------------


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_value_args(kind: str) -> str:
    if kind == "file":
        return "-r -F"
    if kind == "dir":
        return "-r -x -a '(__fish_complete_directories)'"
    if kind == "session":
        return "-r -x -a '(__agentsctl_sessions)'"
    if kind == "provider":
        return "-r -x -a '(__agentsctl_providers)'"
    if kind.startswith("choices "):
        return f"-r -x -a {_fish_quote(kind.removeprefix('choices '))}"
    return "-r -x"


def fish_script() -> str:
    specs = command_specs()
    value_cases = "\n".join(
        f"        case {_fish_quote(spec.path + '|' + flag)}\n            return 0"
        for spec in specs
        for option in spec.options
        if option.value is not None
        for flag in option.flags
    )
    groups = " ".join(GROUPS)
    lines = [
        "# fish completion for agentsctl, generated by `agentsctl completion fish`.",
        "# Install: agentsctl completion fish > ~/.config/fish/completions/agentsctl.fish",
        "",
        "function __agentsctl_takes_value --argument-names cmd opt",
        '    switch "$cmd|$opt"',
        value_cases,
        "    end",
        "    return 1",
        "end",
        "",
        "# Sets __agentsctl_cmd (the command path), __agentsctl_npos (positionals given)",
        "# and __agentsctl_globals (--socket/--state-dir given) from the words typed.",
        "function __agentsctl_parse",
        "    set -l words (commandline -opc)",
        "    set -g __agentsctl_cmd ''",
        "    set -g __agentsctl_npos 0",
        "    set -g __agentsctl_pos0 ''",
        "    set -g __agentsctl_globals",
        "    set -l i 2",
        "    while test $i -le (count $words)",
        "        set -l word $words[$i]",
        "        if string match -q -- '-*' $word",
        '            if __agentsctl_takes_value "$__agentsctl_cmd" $word',
        "                set -l next (math $i + 1)",
        '                if test -z "$__agentsctl_cmd"; and test $next -le (count $words)',
        "                    set -a __agentsctl_globals $word $words[$next]",
        "                end",
        "                set i (math $i + 2)",
        "                continue",
        "            end",
        '        else if test -z "$__agentsctl_cmd"',
        "            set __agentsctl_cmd $word",
        f"        else if contains -- $__agentsctl_cmd {groups}",
        '            set __agentsctl_cmd "$__agentsctl_cmd $word"',
        "        else",
        "            test $__agentsctl_npos -eq 0; and set __agentsctl_pos0 $word",
        "            set __agentsctl_npos (math $__agentsctl_npos + 1)",
        "        end",
        "        set i (math $i + 1)",
        "    end",
        "end",
        "",
        "function __agentsctl_at --argument-names want",
        "    __agentsctl_parse",
        '    test "$__agentsctl_cmd" = "$want"',
        "end",
        "",
        "function __agentsctl_pos --argument-names want index",
        "    __agentsctl_parse",
        '    test "$__agentsctl_cmd" = "$want"; and test $__agentsctl_npos -eq $index',
        "end",
        "",
        "function __agentsctl_pos_from --argument-names want index",
        "    __agentsctl_parse",
        '    test "$__agentsctl_cmd" = "$want"; and test $__agentsctl_npos -ge $index',
        "end",
        "",
        "# A field of `options` or `commands` of the session typed first (Rule 2).",
        "function __agentsctl_listed --argument-names what field suffix",
        "    __agentsctl_parse",
        '    test -n "$__agentsctl_pos0"; or return 0',
        "    command agentsctl $__agentsctl_globals --no-start $what $__agentsctl_pos0 --json \\",
        '        2>/dev/null | string match -r -g "\\"$field\\":\\s*\\"([^\\"]*)\\"" |',
        "        string replace -r '$' \"$suffix\"",
        "end",
        "",
        "function __agentsctl_sessions",
        "    __agentsctl_parse",
        "    command agentsctl $__agentsctl_globals --no-start ls --json 2>/dev/null |",
        '        string match -r -g \'"sessionId":\\s*"([^"]*)"\'',
        "end",
        "",
        "function __agentsctl_providers",
        "    __agentsctl_parse",
        "    command agentsctl $__agentsctl_globals --no-start providers 2>/dev/null",
        "    or string split ' ' -- " + _fish_quote(" ".join(builtin_provider_names())),
        "end",
        "",
        "complete -c agentsctl -f",
    ]
    for word, summary in _top_words():
        lines.append(
            f"complete -c agentsctl -n '__agentsctl_at \"\"' -a {_fish_quote(word)} "
            f"-d {_fish_quote(summary)}"
        )
    for group in GROUPS:
        for verb, summary in _verbs(group):
            lines.append(
                f"complete -c agentsctl -n {_fish_quote(f'__agentsctl_at {group}')} "
                f"-a {_fish_quote(verb)} -d {_fish_quote(summary)}"
            )
    for spec in specs:
        condition = _fish_quote(f'__agentsctl_at "{spec.path}"')
        for option in spec.options:
            flags = []
            for flag in option.flags:
                if flag.startswith("--"):
                    flags.append(f"-l {flag[2:]}")
                elif len(flag) == 2:
                    flags.append(f"-s {flag[1]}")
            value = "" if option.value is None else " " + _fish_value_args(option.value)
            lines.append(
                f"complete -c agentsctl -n {condition} {' '.join(flags)}{value} "
                f"-d {_fish_quote(option.help.split(';')[0])}"
            )
        for index, kind in enumerate(spec.positionals):
            if kind == "session":
                candidates = "'(__agentsctl_sessions)'"
            elif kind == "provider":
                candidates = "'(__agentsctl_providers)'"
            elif kind.startswith("choices "):
                candidates = _fish_quote(kind.removeprefix("choices "))
            elif kind == "option":
                candidates = "'(__agentsctl_listed options key =)'"
            elif kind == "command":
                candidates = "'(__agentsctl_listed commands name)'"
            else:
                continue
            last = spec.repeats and index == len(spec.positionals) - 1
            test = "__agentsctl_pos_from" if last else "__agentsctl_pos"
            condition = _fish_quote(f'{test} "{spec.path}" {index}')
            lines.append(f"complete -c agentsctl -n {condition} -a {candidates}")
    return "\n".join(lines) + "\n"
