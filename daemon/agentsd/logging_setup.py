"""Log lines for a terminal or for journald, chosen by where stderr really goes.

Under systemd, stderr is a stream into journald, which stamps every line with its
own time, unit and pid; it reads a ``<N>`` prefix as the line's syslog priority, so
``journalctl -p warning`` and the colours of ``journalctl`` work. Anywhere else a
person reads the lines, so they carry a local timestamp, the level and the logger.

systemd sets ``$JOURNAL_STREAM`` to ``st_dev:st_ino`` of the stream it connected.
The variable is inherited by everything below the service (an agent's shell, a
``make run`` in a project), so only a match with the fd we actually write to proves
the journal is on the other end.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Final, TextIO

__all__ = ["LEVELS", "configure_logging", "writes_to_journal"]

LEVELS: Final[Mapping[str, int]] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
"""The level names ``configure_logging`` accepts (any case)."""

_SYSLOG_PRIORITY: Final[Mapping[int, int]] = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}
"""sd-daemon.h's SD_DEBUG .. SD_CRIT for the stdlib levels. WARNING maps to 4
(warning), not 5 (notice), so ``journalctl -p warning`` shows our warnings."""

TERMINAL_FORMAT: Final = "%(asctime)s.%(msecs)03d %(levelname)-8s %(name)s: %(message)s"
TERMINAL_DATEFMT: Final = "%Y-%m-%d %H:%M:%S"


def _syslog_priority(levelno: int) -> int:
    """The priority of the nearest standard level at or below ``levelno``."""
    for level in sorted(_SYSLOG_PRIORITY, reverse=True):
        if levelno >= level:
            return _SYSLOG_PRIORITY[level]
    return _SYSLOG_PRIORITY[logging.DEBUG]


class JournalFormatter(logging.Formatter):
    """``<N>logger: message``, with ``<N>`` repeated on every line of a multi-line
    record (a traceback), because journald makes each line its own entry and an
    unprefixed line would fall back to the default priority."""

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{_syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


class _AgentsdHandler(logging.StreamHandler[TextIO]):
    """Marks the handler ``configure_logging`` installed, so that calling it again
    replaces that one handler and leaves everybody else's (pytest's) alone."""


def writes_to_journal(stream: TextIO, env: Mapping[str, str] = os.environ) -> bool:
    """True when ``stream`` is the very stream ``$JOURNAL_STREAM`` describes.

    False for a missing, malformed or non-matching value and for streams without a
    file descriptor. Lenient on purpose, unlike the parsing in ``agentsd.systemd``:
    the variable leaks to grandchildren, and a stale value must cost nothing more
    than timestamps.
    """
    value = env.get("JOURNAL_STREAM")
    if not value:
        return False
    dev_text, sep, ino_text = value.partition(":")
    if not (sep and dev_text.isdecimal() and ino_text.isdecimal()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):
        # io.UnsupportedOperation (no fileno) is an OSError; a closed file raises
        # ValueError.
        return False
    return (st.st_dev, st.st_ino) == (int(dev_text), int(ino_text))


def configure_logging(
    level: str,
    *,
    stream: TextIO | None = None,
    env: Mapping[str, str] = os.environ,
) -> None:
    """Send the root logger's records at ``level`` and above to ``stream``.

    ``stream`` defaults to ``sys.stderr`` as it is at call time. The format is the
    journald one when :func:`writes_to_journal` says so, else the terminal one.
    Calling again replaces the handler an earlier call installed; handlers added by
    others are kept. Raises ``ValueError`` naming the valid levels for an unknown
    ``level``, before changing anything.
    """
    levelno = LEVELS.get(level.lower())
    if levelno is None:
        raise ValueError(f"unknown log level {level!r}; valid levels: {', '.join(LEVELS)}")
    target = sys.stderr if stream is None else stream
    handler = _AgentsdHandler(target)
    if writes_to_journal(target, env):
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter(TERMINAL_FORMAT, TERMINAL_DATEFMT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _AgentsdHandler)]:
        root.removeHandler(old)
        old.close()  # StreamHandler.close leaves the stream itself open.
    root.addHandler(handler)
    root.setLevel(levelno)
