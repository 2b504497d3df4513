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
from agentsd_protocol.providers import builtin_provider_names
from tests.daemon_process import DaemonProcess, running_daemon

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
    env = with_agentsctl()
    socket_args = ["--socket", str(daemon.socket)]
    assert sorted(complete_in_bash(*socket_args, "attach", "", env=env)) == ids
    assert complete_in_bash(*socket_args, "approve", ids[1][:-1], env=env) == [ids[1]]
    assert complete_in_bash(*socket_args, "approve", ids[0], "", env=env) == []  # APPROVAL
    # No daemon there: no ids, no error, and no daemon started by a TAB press.
    missing = daemon.socket.with_name("none.sock")
    assert complete_in_bash("--socket", str(missing), "show", "", env=env) == []
    assert not missing.exists()


def with_agentsctl() -> dict[str, str]:
    """The environment with this venv's ``agentsctl`` first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def test_bash_completes_the_built_in_providers_when_agentsctl_does_not_run(
    tmp_path: Path,
) -> None:
    # A PATH with bash but no agentsctl: the names written into the script.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bash").symlink_to(shutil.which("bash") or "/bin/bash")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    offered = complete_in_bash("new", "--provider", "", env=env)
    assert offered == ["mock", "codex", "claude", "codex-acp", "claude-agent-acp", "gemini"]
    assert offered == builtin_provider_names()
    assert complete_in_bash("new", "g", env=env) == ["gemini"]  # the positional PROVIDER
    assert complete_in_bash("ls", "--provider", "c", env=env) == [
        "codex",
        "claude",
        "codex-acp",
        "claude-agent-acp",
    ]


def test_bash_completes_the_built_in_providers_when_no_daemon_answers(tmp_path: Path) -> None:
    missing = tmp_path / "none.sock"
    args = ["--socket", str(missing), "--state-dir", str(tmp_path / "state")]
    offered = complete_in_bash(*args, "new", "--provider", "", env=with_agentsctl())
    assert offered == builtin_provider_names()
    assert not missing.exists()  # no daemon started by a TAB press


def test_bash_completes_the_daemons_providers_with_its_configured_agents(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[agents.opencode]\ncommand = ["opencode", "acp"]\n'
        '[agents.gemini]\ncommand = ["gemini", "--experimental-acp"]\n'
    )
    with running_daemon(extra_args=["--config", str(config)]) as daemon:
        args = ["--socket", str(daemon.socket)]
        offered = complete_in_bash(*args, "new", "--provider", "", env=with_agentsctl())
        assert offered == sorted([*builtin_provider_names(), "opencode"])
        assert complete_in_bash(*args, "new", "o", env=with_agentsctl()) == ["opencode"]
        status = quick_call(daemon.socket, "daemon.status")
        assert status["providers"] == offered


def test_providers_prints_the_daemons_or_the_built_in_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[agents.qwen]\ncommand = ["qwen", "--acp"]\ndisplay_name = "Qwen"\n')
    with running_daemon(extra_args=["--config", str(config)]) as daemon:
        assert main(["--socket", str(daemon.socket), "providers"]) == EXIT_OK
        out = capsys.readouterr()
        assert out.out.splitlines() == sorted([*builtin_provider_names(), "qwen"])
        assert out.err == ""
    missing = tmp_path / "none.sock"
    args = ["--socket", str(missing), "--state-dir", str(tmp_path / "state")]
    assert main([*args, "providers"]) == EXIT_OK  # never starts a daemon, even without --no-start
    out = capsys.readouterr()
    assert out.out.splitlines() == builtin_provider_names()
    assert "no daemon answers" in out.err
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
        "start stop restart ping reload-env",
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
    assert offer("agentsctl new --provider gem") == ["gemini"]
    assert offer("agentsctl send s1 ") == []


def test_set_and_command_complete_from_the_sessions_options_and_commands(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    sid = quick_call(
        daemon.socket, "agentSession.create", {"provider": "mock", "cwd": os.getcwd()}
    )["sessionId"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    at = ["--socket", str(daemon.socket)]
    assert complete_in_bash(*at, "set", sid, "mo", env=env) == ["model="]
    assert complete_in_bash(*at, "set", sid, "model=mock-deep", "chunkD", env=env) == [
        "chunkDelayS="
    ]
    assert complete_in_bash(*at, "command", sid, "gr", env=env) == ["greet"]
    assert set(complete_in_bash(*at, "command", sid, "", env=env)) == {"compact", "clear", "greet"}
    assert complete_in_bash(*at, "command", sid, "greet", "", env=env) == []  # free text
    assert complete_in_bash(*at, "set", "nope", "mo", env=env) == []  # no such session
    for command in ("options", "commands", "compact", "clear"):
        assert complete_in_bash(*at, command, sid[:-1], env=env) == [sid]

    if shutil.which("fish") is None:
        return
    path = tmp_path / "agentsctl.fish"
    path.write_text(fish_script())
    line = f"agentsctl --socket {daemon.socket} "
    for typed, wanted in ((f"set {sid} mo", ["model="]), (f"command {sid} gr", ["greet"])):
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source {shlex.quote(str(path))}; complete -C "
             f"{shlex.quote(line + typed)}"],
            capture_output=True, text=True, timeout=SHELL_TIMEOUT_S, env=env, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert [row.split("\t")[0] for row in done.stdout.splitlines()] == wanted


def test_bash_completes_the_conversation_controls(tmp_path: Path) -> None:
    (tmp_path / "shot.png").write_text("")
    assert set(complete_in_bash("ask", "--")) >= {
        "--provider",
        "--session",
        "--no-wait",
        "--image",
        "--file",
    }
    assert complete_in_bash("ask", "--provider", "c") == [
        "codex",
        "claude",
        "codex-acp",
        "claude-agent-acp",
    ]
    assert complete_in_bash("send", "s1", "--image", f"{tmp_path}/s") == [f"{tmp_path}/shot.png"]
    assert complete_in_bash("send", "s1", "--file", f"{tmp_path}/s") == [f"{tmp_path}/shot.png"]
    assert set(complete_in_bash("send", "s1", "--")) >= {"--image", "--file", "--queue"}
    assert complete_in_bash("new", "--resume") == ["--resume-from"]
    assert complete_in_bash("new", "--resume-from", "") == []  # a conversation id: free text
