"""Configuration: defaults, the TOML file, and refusals that say what is wrong."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsd.config import Config, ConfigError, Ladder, check_config, load_config
from agentsd.providers import provider_registry
from agentsd.providers.acp import AcpProvider
from tests.daemon_process import (
    DaemonProcess,
    daemon_env,
    make_temp_dir,
    run_daemon,
    wait_until_serving,
)

EXIT_USAGE = 2  # agentsd.main: bad options or configuration


@pytest.fixture
def base() -> Iterator[Path]:
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write(base: Path, text: str) -> Path:
    path = base / "config.toml"
    path.write_text(text)
    return path


# ---- load_config ---------------------------------------------------------------------


def test_a_missing_default_file_gives_the_defaults(base: Path) -> None:
    assert load_config(base / "nope.toml", required=False) == Config()


def test_a_missing_explicit_file_is_an_error_naming_it(base: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(base / "nope.toml", required=True)
    assert str(base / "nope.toml") in str(info.value)


def test_values_from_the_file_override_the_defaults(base: Path) -> None:
    path = write(
        base,
        'log_level = "debug"\n'
        "max_frame_bytes = 4096\n"
        'agent_env = "login-shell"\n'
        "login_shell_timeout_s = 2.5\n"
        "[ladder]\n"
        "term_grace_s = 0.5\n"
        "[providers.mock]\n"
        'command = ["mock-agent", "--fast"]\n'
        'env = { A = "1" }\n',
    )
    config = load_config(path, required=True)
    assert config.log_level == "debug"
    assert config.max_frame_bytes == 4096
    assert config.ladder == Ladder(term_grace_s=0.5)
    assert config.providers["mock"].command == ["mock-agent", "--fast"]
    assert config.providers["mock"].env == {"A": "1"}
    assert config.idle_timeout_s == Config().idle_timeout_s
    assert config.agent_env == "login-shell"
    assert config.login_shell_timeout_s == 2.5


def test_held_agents_are_reattached_after_a_crash_by_default(base: Path) -> None:
    assert Config().crash_policy == "reattach"
    path = write(base, 'holder = true\ncrash_policy = "end"\n')
    assert load_config(path, required=True).crash_policy == "end"


def test_agents_get_the_login_shells_environment_only_under_systemd_by_default() -> None:
    assert Config().agent_env == "auto"
    assert Config().login_shell_timeout_s == 10.0


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        pytest.param("bogus_key = 1\n", ["bogus_key"], id="unknown-top-level-key"),
        pytest.param("[ladder]\nbogus = 1\n", ["bogus", "$.ladder"], id="unknown-nested-key"),
        pytest.param('max_frame_bytes = "big"\n', ["$.max_frame_bytes"], id="wrong-type"),
        pytest.param('log_level = "loud"\n', ["log_level"], id="bad-log-level"),
        pytest.param("max_frame_bytes = [\n", ["config file"], id="not-toml"),
        pytest.param('agent_env = "zsh"\n', ["$.agent_env", "zsh"], id="bad-agent-env"),
        pytest.param(
            'crash_policy = "restart"\n',
            ["$.crash_policy", "restart", "reattach", "end"],
            id="bad-crash-policy",
        ),
        pytest.param("crash_policy = true\n", ["$.crash_policy"], id="crash-policy-not-a-string"),
        pytest.param("login_shell_timeout_s = 0\n", ["login_shell_timeout_s"], id="zero-bound"),
        pytest.param(
            "login_shell_timeout_s = 600\n", ["login_shell_timeout_s", "120"], id="huge-bound"
        ),
    ],
)
def test_a_bad_file_is_an_error_naming_the_problem(
    base: Path, text: str, needles: list[str]
) -> None:
    path = write(base, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, required=False)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, message


def test_an_unreadable_file_is_an_error(base: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(base, required=True)  # a directory


@pytest.mark.parametrize("level", ["debug", "INFO", "Warning", "error", "critical"])
def test_log_levels_are_case_insensitive(base: Path, level: str) -> None:
    assert load_config(write(base, f'log_level = "{level}"\n'), required=True).log_level == level


# ---- the daemon's command line ------------------------------------------------------------


def daemon_args(base: Path, *extra: str) -> list[str]:
    return ["--socket", str(base / "run" / "s.sock"), "--state-dir", str(base / "state"), *extra]


def assert_usage_error(base: Path, *extra: str, needles: list[str]) -> None:
    proc = run_daemon(daemon_args(base, *extra))
    assert proc.returncode == EXIT_USAGE, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith("agentsd: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert not (base / "state").exists(), "nothing may be created before the config is valid"


def test_the_daemon_refuses_an_unknown_key(base: Path) -> None:
    path = write(base, "max_frame_byte = 4096\n")
    assert_usage_error(base, "--config", str(path), needles=["max_frame_byte", str(path)])


def test_the_daemon_refuses_a_missing_explicit_config(base: Path) -> None:
    missing = base / "missing.toml"
    assert_usage_error(base, "--config", str(missing), needles=[str(missing), "does not exist"])


def test_the_daemon_refuses_a_bad_log_level_in_the_file(base: Path) -> None:
    path = write(base, 'log_level = "chatty"\n')
    assert_usage_error(base, "--config", str(path), needles=["log_level"])


def test_the_daemon_refuses_a_bad_log_level_option(base: Path) -> None:
    assert_usage_error(base, "--log-level", "chatty", needles=["chatty"])


def test_an_unknown_provider_in_the_config_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[providers.nosuch]\ncommand = ["x"]\n')
    result = run_daemon(["--config", str(config), "--state-dir", str(tmp_path / "state")])
    assert result.returncode == 2
    assert "nosuch" in result.stderr


def test_an_acp_agent_cannot_take_a_built_in_providers_name(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[agents.codex]\ncommand = ["codex-acp"]\n')
    result = run_daemon(["--config", str(config), "--state-dir", str(tmp_path / "state")])
    assert result.returncode == 2
    assert "[agents.codex]: codex is a built-in provider" in result.stderr


def test_an_acp_agent_is_a_provider_the_config_can_override(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(
        '[agents.opencode]\ncommand = ["opencode", "acp"]\ndisplay_name = "OpenCode"\n'
        '[agents.gemini]\ncommand = ["gemini", "--experimental-acp"]\n'
        '[providers.opencode]\nenv = { "A" = "1" }\n'
    )
    loaded = load_config(config, required=True)
    registry = provider_registry(loaded.agents)
    assert {"mock", "codex", "claude", "codex-acp", "claude-agent-acp", "gemini"} <= set(registry)
    opencode = registry["opencode"]
    assert isinstance(opencode, AcpProvider)
    assert opencode.agent.command == ("opencode", "acp")
    assert opencode.agent.display_name == "OpenCode"
    gemini = registry["gemini"]
    assert isinstance(gemini, AcpProvider)
    assert gemini.agent.command == ("gemini", "--experimental-acp")
    assert gemini.agent.display_name == "Gemini CLI"


# ---- every value is checked at load (issue 18: nonsense config was accepted) ----------------

# (TOML text, the dotted key, the value as shown, a piece of the allowed range)
NONSENSE = [
    pytest.param("handshake_timeout_s = -1\n", "handshake_timeout_s", "-1", "more than 0",
                 id="negative-handshake-timeout"),
    pytest.param("handshake_timeout_s = nan\n", "handshake_timeout_s", "nan", "more than 0",
                 id="nan-handshake-timeout"),
    pytest.param("idle_timeout_s = inf\n", "idle_timeout_s", "inf", "at most 2592000",
                 id="infinite-idle-timeout"),
    pytest.param("[ladder]\nterm_grace_s = -0.5\n", "ladder.term_grace_s", "-0.5", "at least 0",
                 id="negative-ladder-grace"),
    pytest.param("[ladder]\nkill_wait_s = 0\n", "ladder.kill_wait_s", "0", "at least 0.1",
                 id="zero-kill-wait"),
    pytest.param("max_frame_bytes = 0\n", "max_frame_bytes", "0", "at least 4096",
                 id="zero-max-frame-bytes"),
    pytest.param('[providers.mock]\nenv = { "A=B" = "1" }\n', "providers.mock.env", "'A=B'",
                 "without '='", id="env-key-with-equals"),
    pytest.param('[providers.mock]\nenv = { "A\\u0000B" = "1" }\n', "providers.mock.env",
                 "'A\\x00B'", "NUL", id="env-key-with-nul"),
    pytest.param('[providers.mock]\nenv = { "" = "1" }\n', "providers.mock.env", "''",
                 "non-empty", id="empty-env-key"),
    pytest.param('socket = "run/agentsd.sock"\n', "socket", "'run/agentsd.sock'", "absolute",
                 id="relative-socket-path"),
    pytest.param('state_dir = "state"\n', "state_dir", "'state'", "absolute",
                 id="relative-state-dir"),
    pytest.param("[providers.mock]\ncommand = []\n", "providers.mock.command", "[]",
                 "non-empty list", id="empty-command"),
    pytest.param("[agents.gemini]\ncommand = []\n", "agents.gemini.command", "[]",
                 "non-empty list", id="empty-agent-command"),
    pytest.param('[agents.x]\ncommand = ["x"]\nenv = { "A=B" = "1" }\n', "agents.x.env",
                 "'A=B'", "without '='", id="agent-env-key-with-equals"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "key", "shown", "allowed"), NONSENSE)
def test_a_value_out_of_its_range_is_refused_naming_key_value_and_range(
    base: Path, text: str, key: str, shown: str, allowed: str
) -> None:
    path = write(base, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, required=True)
    message = str(info.value)
    assert f"{key} = " in message, message
    assert shown in message, message
    assert allowed in message, message


@pytest.mark.parametrize(("text", "key", "shown", "allowed"), NONSENSE)
def test_the_daemon_refuses_nonsense_config_at_start_with_exit_2(
    base: Path, text: str, key: str, shown: str, allowed: str
) -> None:
    path = write(base, text)
    assert_usage_error(base, "--config", str(path), needles=[key, shown, allowed])


def test_a_huge_bad_value_is_quoted_as_a_bounded_excerpt(base: Path) -> None:
    path = write(base, f'state_dir = "{"x" * 1_000_000}"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, required=True)
    message = str(info.value)
    assert len(message) < 500, len(message)
    assert "… (1000000 bytes)" in message


def test_the_edges_of_each_range_are_accepted(base: Path) -> None:
    path = write(
        base,
        "handshake_timeout_s = 3600\nmax_frame_bytes = 4096\nidle_timeout_s = 0.5\n"
        "[ladder]\neof_grace_s = 0\nterm_grace_s = 0\nkill_wait_s = 0.1\nproof_rounds = 0\n",
    )
    config = load_config(path, required=True)
    assert config.ladder.term_grace_s == 0
    assert config.max_frame_bytes == 4096


def test_the_defaults_pass_their_own_checks() -> None:
    assert list(check_config(Config())) == []


def test_a_socket_path_too_long_for_af_unix_is_refused(base: Path) -> None:
    long_socket = "/tmp/" + "s" * 120 + ".sock"
    assert_usage_error(base, "--socket", long_socket, needles=["107 bytes", "AF_UNIX"])


def test_a_relative_socket_option_is_taken_under_the_current_directory(base: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "agentsd", "--socket", "rel.sock", "--state-dir", "st"],
        cwd=base, env=daemon_env(base), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        daemon = DaemonProcess(base / "rel.sock", base / "st", process, base / "no.log")
        wait_until_serving(daemon)
        _pid, socket_path, *_ = (base / "st" / "agentsd.lock").read_text().split("\n")
        assert socket_path == str(base / "rel.sock")
        assert daemon.stop() == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
