"""``agentsctl completion``: the scripts parse in their shell, and bash's completes
commands, verbs, options, option values and (from a real daemon) session ids."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentsctl.cli import COMMANDS, EXIT_OK, EXIT_USAGE, main
from agentsctl.completion import bash_script, command_specs, fish_script, zsh_script
from agentsctl.daemon import quick_call
from tests.daemon_process import DaemonProcess

SHELL_TIMEOUT_S = 30.0  # one shell run; the session-id completion runs agentsctl once


def complete_in_bash(*words: str, env: dict[str, str] | None = None) -> list[str]:
    """What bash's completion offers for ``words`` (the last one being completed)."""
    script = (
        "source /dev/stdin\n"
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in ('agentsctl', *words))})\n"
        "COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))\n"
        "_agentsctl\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        input=bash_script(),
        capture_output=True,
        text=True,
        timeout=SHELL_TIMEOUT_S,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_completion_prints_a_script_per_shell(capsys: pytest.CaptureFixture[str]) -> None:
    for shell, expected in (
        ("bash", bash_script()),
        ("zsh", zsh_script()),
        ("fish", fish_script()),
    ):
        assert main(["completion", shell]) == EXIT_OK
        assert capsys.readouterr().out == expected


def test_an_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["completion", "tcsh"])
    assert caught.value.code == EXIT_USAGE
    assert "invalid choice" in capsys.readouterr().err


def test_the_bash_script_parses_and_registers_itself(tmp_path: Path) -> None:
    path = tmp_path / "agentsctl.bash"
    path.write_text(bash_script())
    syntax = subprocess.run(
        ["bash", "-n", str(path)], capture_output=True, text=True, timeout=SHELL_TIMEOUT_S
    )
    assert syntax.returncode == 0, syntax.stderr
    loaded = subprocess.run(
        [
            "bash",
            "--norc",
            "--noprofile",
            "-c",
            f"source {shlex.quote(str(path))}; complete -p agentsctl",
        ],
        capture_output=True,
        text=True,
        timeout=SHELL_TIMEOUT_S,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "complete -F _agentsctl agentsctl"


def test_bash_completes_every_command() -> None:
    offered = complete_in_bash("")
    assert offered == list(dict.fromkeys(c.name.partition(" ")[0] for c in COMMANDS))
    assert complete_in_bash("st") == ["start", "status"]
    assert complete_in_bash("--no-start", "--socket", "/x", "at") == ["attach"]


def test_bash_completes_verbs_options_and_values(tmp_path: Path) -> None:
    assert complete_in_bash("daemon", "s") == ["start", "stop"]
    assert complete_in_bash("daemon", "start", "--f") == ["--foreground"]
    assert complete_in_bash("--no") == ["--no-start"]
    assert set(complete_in_bash("log", "s1", "--")) >= {
        "--json",
        "--jsonl",
        "--follow",
        "--after-seq",
    }
    assert complete_in_bash("completion", "") == ["bash", "zsh", "fish"]
    assert complete_in_bash("ls", "--state", "r") == ["running"]
    assert complete_in_bash("new", "--provider", "") == ["codex", "claude", "acp", "mock"]
    (tmp_path / "subdir").mkdir()
    (tmp_path / "file").write_text("")
    assert complete_in_bash("new", "--cwd", f"{tmp_path}/") == [f"{tmp_path}/subdir"]
    assert set(complete_in_bash("--socket", f"{tmp_path}/")) == {
        f"{tmp_path}/subdir",
        f"{tmp_path}/file",
    }
    assert complete_in_bash("send", "s1", "") == []  # free text: nothing to offer


def test_bash_completes_session_ids_from_the_daemon(daemon: DaemonProcess) -> None:
    ids = sorted(
        quick_call(
            daemon.socket,
            "agentSession.create",
            {"provider": "mock", "cwd": os.getcwd(), "start": False, "title": title},
        )["sessionId"]
        for title in ("one", "two")
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    socket_args = ["--socket", str(daemon.socket)]
    assert sorted(complete_in_bash(*socket_args, "attach", "", env=env)) == ids
    assert complete_in_bash(*socket_args, "approve", ids[1][:-1], env=env) == [ids[1]]
    assert complete_in_bash(*socket_args, "approve", ids[0], "", env=env) == []  # APPROVAL
    # No daemon there: no ids, no error, and no daemon started by a TAB press.
    missing = daemon.socket.with_name("none.sock")
    assert complete_in_bash("--socket", str(missing), "show", "", env=env) == []
    assert not missing.exists()


def test_every_command_and_option_is_in_the_scripts() -> None:
    bash, fish = bash_script(), fish_script()
    for spec in command_specs():
        for option in spec.options:
            for flag in option.flags:
                assert f'"{spec.path}|{flag}"' in bash or option.value is None
                assert flag in bash
                if flag.startswith("--"):
                    assert f"-l {flag[2:]}" in fish
    for command in COMMANDS:
        assert command.name.rpartition(" ")[2] in fish


@pytest.mark.parametrize(("shell", "script"), [("zsh", zsh_script), ("fish", fish_script)])
def test_the_other_scripts_parse_where_their_shell_is_installed(
    shell: str, script: object, tmp_path: Path
) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed")
    assert callable(script)
    path = tmp_path / f"agentsctl.{shell}"
    path.write_text(script())
    done = subprocess.run(
        [shell, "-n", str(path)], capture_output=True, text=True, timeout=SHELL_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr


def test_zsh_completes_through_bashcompinit(tmp_path: Path) -> None:
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    path = tmp_path / "agentsctl.zsh"
    path.write_text(zsh_script())
    # What bashcompinit's compgen -F does: the function runs under `emulate sh`
    # (0-based arrays); zsh itself then filters the candidates by the typed prefix.
    probe = (
        f"source {shlex.quote(str(path))}\n"
        "offer() { emulate -L sh; setopt kshglob noshglob braceexpand\n"
        '  COMP_WORDS=("$@"); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); COMPREPLY=()\n'
        '  _agentsctl; echo "${COMPREPLY[*]}"; }\n'
        "offer agentsctl daemon s\n"
        "offer agentsctl completion ''\n"
        "offer agentsctl --no-start ls --state ''\n"
        "complete -p\n"
    )
    done = subprocess.run(
        ["zsh", "-f", "-c", probe], capture_output=True, text=True, timeout=SHELL_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == [
        "start stop ping reload-env",
        "bash zsh fish",
        "stopped starting running stopping exit-unproven",
    ]
    assert "complete -F _agentsctl agentsctl" in lines


def test_fish_completes_commands_options_and_values(tmp_path: Path) -> None:
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    path = tmp_path / "agentsctl.fish"
    path.write_text(fish_script())

    def offer(line: str) -> list[str]:
        done = subprocess.run(
            [
                "fish",
                "--no-config",
                "-c",
                f"source {shlex.quote(str(path))}; complete -C {shlex.quote(line)}",
            ],
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT_S,
        )
        assert done.returncode == 0, done.stderr
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert offer("agentsctl st") == ["start", "status"]
    assert offer("agentsctl --socket /x daemon s") == ["start", "stop"]
    assert set(offer("agentsctl log s1 --")) >= {"--json", "--jsonl", "--follow", "--after-seq"}
    assert offer("agentsctl completion ") == ["bash", "fish", "zsh"]
    assert offer("agentsctl new --provider m") == ["mock"]
    assert offer("agentsctl send s1 ") == []


def test_bash_completes_the_conversation_controls(tmp_path: Path) -> None:
    (tmp_path / "shot.png").write_text("")
    assert set(complete_in_bash("ask", "--")) >= {
        "--provider",
        "--session",
        "--no-wait",
        "--image",
        "--file",
    }
    assert complete_in_bash("ask", "--provider", "c") == ["codex", "claude"]
    assert complete_in_bash("send", "s1", "--image", f"{tmp_path}/s") == [f"{tmp_path}/shot.png"]
    assert complete_in_bash("send", "s1", "--file", f"{tmp_path}/s") == [f"{tmp_path}/shot.png"]
    assert set(complete_in_bash("send", "s1", "--")) >= {"--image", "--file", "--queue"}
    assert complete_in_bash("new", "--resume") == ["--resume-from"]
    assert complete_in_bash("new", "--resume-from", "") == []  # a conversation id: free text
