"""Configuration: defaults, the TOML file, and refusals that say what is wrong."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsd.config import Config, ConfigError, Ladder, load_config
from tests.daemon_process import make_temp_dir, run_daemon

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
