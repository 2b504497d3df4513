"""An agent's stderr (``agentsd.stderr_log``): a bounded, rotated log that goes with
its session, and a tail that says why the agent ended, in ``child.exited``, in the
session's last exit and in the error of a start that failed."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import trio

from agentsd.stderr_log import TAIL_BYTES, StderrLog, rotated
from agentsd.store.writer import Store, open_store
from agentsd_protocol.errors import AgentExited
from tests.daemon.test_session_task import _supervisor, journal, make_config

GIB = 1 << 30
LOG_BYTES = 256 * 1024  # small, so that a flood rotates the log thousands of times


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "agentsd.db") as store:
        yield store


def log_parts(path: Path) -> list[Path]:
    return [p for p in (path, rotated(path)) if p.exists()]


async def test_the_log_keeps_the_newest_part_within_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "s.stderr.log"
    stderr = StderrLog(path, LOG_BYTES)
    with trio.fail_after(30):
        async with stderr.capture() as fd:
            lines = b"".join(b"line %06d\n" % n for n in range(100_000))  # 1.1 MB
            await trio.to_thread.run_sync(os.write, fd, lines[:65536])
            for start in range(65536, len(lines), 65536):
                await trio.to_thread.run_sync(os.write, fd, lines[start : start + 65536])
    assert sum(p.stat().st_size for p in log_parts(path)) <= LOG_BYTES
    assert path.read_bytes().endswith(b"line 099999\n")
    kept = rotated(path).read_bytes() + path.read_bytes()
    assert lines.endswith(kept)  # one piece: the newest, nothing missing inside it
    tail = stderr.tail()
    assert tail is not None and tail.endswith("line 099999\n")
    assert len(tail.encode()) <= TAIL_BYTES


async def test_a_tail_cut_inside_a_character_starts_at_a_whole_one(tmp_path: Path) -> None:
    stderr = StderrLog(tmp_path / "s.stderr.log", LOG_BYTES)
    async with stderr.capture() as fd:
        os.write(fd, b"x" + "é".encode() * TAIL_BYTES)
    tail = stderr.tail()
    assert tail is not None and set(tail) == {"é"}


async def test_blank_stderr_has_no_tail(tmp_path: Path) -> None:
    stderr = StderrLog(tmp_path / "s.stderr.log", LOG_BYTES)
    async with stderr.capture() as fd:
        os.write(fd, b"\n  \n")
    assert stderr.tail() is None


async def test_an_agent_that_fails_its_handshake_says_why_to_the_client(
    store: Store, tmp_path: Path
) -> None:
    """It prints a message to stderr and exits 1 during its handshake: the error's
    kind and the agent's message reach whoever started it, and the journal."""
    words = "error: option '--permission-mode <mode>' argument 'manual' is invalid"
    command = [sys.executable, "-c", f"import sys; sys.stderr.write({words!r} + '\\n'); exit(1)"]
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await sup.create(
                provider="mock", cwd=str(tmp_path), title=None, options={}, env={}, command=command
            )
            with pytest.raises(AgentExited) as failed:
                await sup.start(session)
            assert failed.value.kind == "agent_exited"
            assert failed.value.message.endswith(f"its stderr ends: {words}")
            assert failed.value.details["stderrTail"] == words + "\n"
            [exited] = [b for _, k, b in await journal(store, session.id) if k == "child.exited"]
            assert exited["stderrTail"] == words + "\n"
            assert exited["error"]["kind"] == "agent_exited"
            assert words in exited["error"]["message"]
            info = msgspec.to_builtins(session.info())
            assert info["lastExit"]["stderrTail"] == words + "\n"


async def test_an_agent_that_writes_a_gib_to_stderr_leaves_a_bounded_log_gone_with_it(
    store: Store, tmp_path: Path
) -> None:
    flood = (
        "import os, sys\n"
        "block = b'x' * (1 << 20)\n"
        f"for _ in range({GIB} >> 20):\n"
        "    os.write(2, block)\n"
        "os.write(2, b'\\nthe last words\\n')\n"
        "sys.exit(1)\n"
    )
    config = make_config(stderr_log_max_bytes=LOG_BYTES, handshake_timeout_s=300.0)
    with trio.fail_after(300):
        async with await _supervisor(store, tmp_path, config) as sup:
            session = await sup.create(
                provider="mock",
                cwd=str(tmp_path),
                title=None,
                options={},
                env={},
                command=[sys.executable, "-c", flood],
            )
            began = time.monotonic()
            with pytest.raises(AgentExited, match="its stderr ends: the last words"):
                await sup.start(session)
            took_s = time.monotonic() - began
            path = sup.stderr_path(session.id)
            assert sum(p.stat().st_size for p in log_parts(path)) <= LOG_BYTES
            assert path.read_bytes().endswith(b"\nthe last words\n")
            [exited] = [b for _, k, b in await journal(store, session.id) if k == "child.exited"]
            assert exited["stderrTail"].endswith("\nthe last words\n")
            assert len(exited["stderrTail"].encode()) <= TAIL_BYTES
            await sup.delete(session)
            assert log_parts(path) == []
    print(f"1 GiB of stderr read in {took_s:.1f} s")
