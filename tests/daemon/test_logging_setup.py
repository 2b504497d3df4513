"""agentsd.logging_setup: journald lines only when stderr really is the journal."""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TextIO

import pytest

from agentsd.logging_setup import LEVELS, configure_logging, writes_to_journal

TERMINAL_LINE = re.compile(
    r"(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\d{3} (?P<level>[A-Z]+) +agentsd\.test: (?P<msg>.*)"
)


@pytest.fixture(autouse=True)
def root_logger() -> Iterator[logging.Logger]:
    """Give the root logger back exactly as pytest had it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[TextIO]:
    with open(tmp_path / "stderr", "w", encoding="utf-8") as stream:
        yield stream


def _journal_env(stream: TextIO) -> dict[str, str]:
    """What systemd sets for a stream it connected to journald."""
    st = os.fstat(stream.fileno())
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def _written(stream: TextIO) -> list[str]:
    stream.flush()
    return Path(stream.name).read_text(encoding="utf-8").splitlines()


def _log_every_level() -> None:
    log = logging.getLogger("agentsd.test")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    log.critical("c")


def test_journal_lines_carry_syslog_priorities_and_no_timestamp(log_file: TextIO) -> None:
    configure_logging("debug", stream=log_file, env=_journal_env(log_file))
    _log_every_level()
    assert _written(log_file) == [
        "<7>agentsd.test: d",
        "<6>agentsd.test: i",
        "<4>agentsd.test: w",
        "<3>agentsd.test: e",
        "<2>agentsd.test: c",
    ]


def test_journal_traceback_keeps_its_priority_on_every_line(log_file: TextIO) -> None:
    configure_logging("info", stream=log_file, env=_journal_env(log_file))
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("agentsd.test").exception("failed\nbadly")
    lines = _written(log_file)
    assert lines[:2] == ["<3>agentsd.test: failed", "<3>badly"]
    assert lines[-1] == "<3>RuntimeError: boom"
    assert all(line.startswith("<3>") for line in lines)
    assert any("Traceback" in line for line in lines)


def test_terminal_lines_carry_local_time_level_and_logger(log_file: TextIO) -> None:
    configure_logging("debug", stream=log_file, env={})
    before = datetime.now().replace(microsecond=0)
    _log_every_level()
    lines = _written(log_file)
    matches = [TERMINAL_LINE.fullmatch(line) for line in lines]
    assert all(matches), lines
    assert [(m["level"], m["msg"]) for m in matches if m] == [
        ("DEBUG", "d"),
        ("INFO", "i"),
        ("WARNING", "w"),
        ("ERROR", "e"),
        ("CRITICAL", "c"),
    ]
    for m in matches:
        assert m is not None
        stamp = datetime.strptime(m["stamp"], "%Y-%m-%d %H:%M:%S")
        assert 0 <= (stamp - before).total_seconds() < 60


@pytest.mark.parametrize(
    "journal_stream",
    [
        "<other file>",
        "",
        "garbage",
        "12:",
        ":12",
        "1:2:3",
    ],
)
def test_terminal_format_unless_the_journal_stream_matches(
    log_file: TextIO, tmp_path: Path, journal_stream: str
) -> None:
    if journal_stream == "<other file>":
        # Inherited from a parent whose stderr was the journal; ours was redirected.
        with open(tmp_path / "elsewhere", "w", encoding="utf-8") as other:
            journal_stream = _journal_env(other)["JOURNAL_STREAM"]
    env = {"JOURNAL_STREAM": journal_stream}
    assert not writes_to_journal(log_file, env)
    configure_logging("info", stream=log_file, env=env)
    logging.getLogger("agentsd.test").info("hello")
    [line] = _written(log_file)
    assert TERMINAL_LINE.fullmatch(line)


def test_streams_without_a_descriptor_get_the_terminal_format() -> None:
    stream = io.StringIO()
    assert not writes_to_journal(stream, {"JOURNAL_STREAM": "1:1"})
    configure_logging("info", stream=stream, env={"JOURNAL_STREAM": "1:1"})
    logging.getLogger("agentsd.test").info("hello")
    assert TERMINAL_LINE.fullmatch(stream.getvalue().rstrip("\n"))


def test_level_filters_and_is_case_insensitive(log_file: TextIO) -> None:
    configure_logging("WARNING", stream=log_file, env=_journal_env(log_file))
    _log_every_level()
    assert _written(log_file) == ["<4>agentsd.test: w", "<3>agentsd.test: e", "<2>agentsd.test: c"]


@pytest.mark.parametrize("level", ["verbose", "warn", "", "10"])
def test_unknown_level_is_a_clear_error_and_changes_nothing(
    root_logger: logging.Logger, level: str
) -> None:
    handlers, before = root_logger.handlers[:], root_logger.level
    with pytest.raises(ValueError, match="unknown log level") as excinfo:
        configure_logging(level)
    assert all(name in str(excinfo.value) for name in LEVELS)
    assert root_logger.handlers == handlers
    assert root_logger.level == before


def test_configuring_again_replaces_only_our_handler(
    root_logger: logging.Logger, log_file: TextIO
) -> None:
    foreign = logging.NullHandler()
    root_logger.addHandler(foreign)
    first = io.StringIO()
    configure_logging("info", stream=first, env={})
    configure_logging("info", stream=log_file, env=_journal_env(log_file))
    logging.getLogger("agentsd.test").info("once")
    assert first.getvalue() == ""
    assert _written(log_file) == ["<6>agentsd.test: once"]
    assert foreign in root_logger.handlers
