"""The holder (agentsd.holder) with real processes: a real holder process, real
agents, real Unix sockets. A test client plays the daemon; "the daemon dies" is its
connection closing without a word. Every test ends what it started."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsd import cgroup, holder, procfs
from agentsd import child as child_module

HOLDER = Path(holder.__file__)
TIMEOUT_S = 20.0  # a loaded machine's bound on any one wait; never what a test asserts


class Client:
    """One connection to the holder, speaking its wire format, blocking."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(str(path))
        self.decoder = holder.Decoder()
        self.pending: list[tuple[dict[str, Any], bytes]] = []
        self.refs = 0

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        self.sock.sendall(holder.encode(header, payload))

    def next(self) -> tuple[dict[str, Any], bytes]:
        while not self.pending:
            data = self.sock.recv(1 << 16)
            if not data:
                raise EOFError("the holder closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.pop(0)

    def request(self, header: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
        """Send a request and return its reply; relayed messages meanwhile are kept."""
        self.refs += 1
        ref = self.refs
        self.send({**header, "ref": ref}, payload)
        kept: list[tuple[dict[str, Any], bytes]] = []
        while True:
            message = self.next()
            if message[0].get("ref") == ref:
                self.pending[:0] = kept
                return message[0]
            kept.append(message)

    def hello(self, epoch: int, *, keys: bool = False) -> dict[str, Any]:
        header = {"op": "hello", "protocol": holder.PROTOCOL, "epoch": epoch}
        return self.request({**header, "keys": True} if keys else header)

    def read_stream(self, agent: str, stream: str, until: bytes) -> tuple[int, bytes]:
        """Relayed bytes of ``stream`` until they hold ``until``: (first offset,
        bytes). Offsets must follow each other exactly."""
        data = bytearray()
        first: int | None = None
        while until not in data:
            header, payload = self.next()
            if header["op"] != "out" or header["id"] != agent or header["stream"] != stream:
                continue
            if first is None:
                first = header["offset"]
            assert header["offset"] == first + len(data), "a gap or a duplicate"
            data += payload
        assert first is not None
        return first, bytes(data)

    def wait_for(self, op: str, agent: str) -> dict[str, Any]:
        while True:
            header, _ = self.next()
            if header["op"] == op and header.get("id") == agent:
                return header

    def close(self) -> None:
        self.sock.close()


class Holder:
    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.path = tmp_path / "holder.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(old)
        listener.listen(16)
        fd = listener.fileno()
        self.errors = tmp_path / "holder.err"  # what it writes: tracebacks only
        with self.errors.open("ab") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-I", str(HOLDER), "--listen-fd", str(fd), *args],
                pass_fds=[fd],
                stderr=errors,
                start_new_session=True,
            )
        listener.close()
        self.clients: list[Client] = []

    def connect(self) -> Client:
        client = Client(self.path)
        self.clients.append(client)
        return client

    def end(self) -> None:
        for client in self.clients:
            client.close()
        if self.process.poll() is None:
            # Its agents are its own session's children: end them with it.
            for pid in _children(self.process.pid):
                with _gone():
                    os.killpg(pid, signal.SIGKILL)
            self.process.kill()
        self.process.wait(TIMEOUT_S)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


class _gone:
    def __enter__(self) -> None:
        return None

    def __exit__(self, et: object, exc: object, tb: object) -> bool:
        return isinstance(exc, ProcessLookupError)


@pytest.fixture
def make_holder(tmp_path: Path) -> Iterator[Any]:
    made: list[Holder] = []

    def make(*args: str) -> Holder:
        h = Holder(tmp_path, *args)
        made.append(h)
        return h

    yield make
    for h in made:
        h.end()


def _python(code: str) -> list[str]:
    return [sys.executable, "-I", "-c", code]


# Echoes every stdin line back as "echo: <line>", flushing each.
ECHO = _python(
    "import sys\n"
    "for line in sys.stdin:\n"
    "    sys.stdout.write('echo: ' + line); sys.stdout.flush()\n"
)
# After a "go" line: N numbered lines, then "done".
COUNTER = _python(
    "import sys\n"
    "n = int(sys.argv[1])\n"
    "sys.stdin.readline()\n"
    "for i in range(n):\n"
    "    sys.stdout.write(f'line {i}\\n'); sys.stdout.flush()\n"
    "sys.stdout.write('done\\n'); sys.stdout.flush()\n"
    "sys.stdin.readline()\n"
)


def _spawn(client: Client, agent: str, argv: list[str], tmp_path: Path) -> int:
    reply = client.request(
        {"op": "spawn", "id": agent, "argv": argv, "cwd": str(tmp_path), "env": dict(os.environ)}
    )
    assert reply["op"] == "spawned", reply
    pid: int = reply["pid"]
    return pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _wait(check: Any) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def test_the_constants_it_copies_match_the_daemons() -> None:
    assert holder.SPAWN_TOKEN_ENV == procfs.SPAWN_TOKEN_ENV
    assert holder.HOLDER_MARK_ENV == procfs.HOLDER_MARK_ENV
    assert holder.CGROUP_PREFIX == cgroup.CGROUP_PREFIX


def test_only_a_session_cgroup_counts_as_an_agents() -> None:
    token = child_module.new_spawn_token()
    assert holder.is_agent_cgroup(cgroup.CGROUP_PREFIX + token)
    assert not holder.is_agent_cgroup("agent-runner.service")
    assert not holder.is_agent_cgroup(cgroup.CGROUP_PREFIX + token.upper())
    assert not holder.is_agent_cgroup(token)


def test_an_agent_is_spawned_fed_and_relayed(make_holder: Any, tmp_path: Path) -> None:
    h = make_holder()
    daemon = h.connect()
    welcome = daemon.hello(1)
    assert welcome["op"] == "welcome" and welcome["agents"] == []
    assert welcome["holder_pid"] == h.process.pid
    pid = _spawn(daemon, "a", ECHO, tmp_path)
    # Its own session and process group, a child of the holder.
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid
    assert holder.parent_pid(pid) == h.process.pid
    assert holder.start_time(pid) == procfs.read_start_time(pid)
    assert daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})["op"] == "ok"
    daemon.send({"op": "write", "id": "a"}, b"hello\n")
    assert daemon.read_stream("a", "out", b"\n") == (0, b"echo: hello\n")
    daemon.send({"op": "write", "id": "a"}, b"again\n")
    assert daemon.read_stream("a", "out", b"\n") == (12, b"echo: again\n")


def test_output_written_while_no_daemon_reads_is_resumed_exactly(
    make_holder: Any, tmp_path: Path
) -> None:
    h = make_holder()
    first = h.connect()
    first.hello(1)
    pid = _spawn(first, "a", [*COUNTER, "2000"], tmp_path)
    first.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    first.send({"op": "write", "id": "a"}, b"go\n")
    _, head = first.read_stream("a", "out", b"line 9\n")
    # The daemon made the first three lines durable, acknowledged them, and died.
    acked = len(b"line 0\nline 1\nline 2\n")
    assert head.startswith(b"line 0\nline 1\nline 2\n")
    first.send({"op": "ack", "id": "a", "stream": "out", "offset": acked})
    # An ack has no reply: a request behind it on the same connection (SIGCONT
    # changes nothing) says it was handled. A newer daemon's hello cuts the old
    # connection off at once, with whatever of it the holder had not read yet.
    assert first.request({"op": "signal", "id": "a", "signal": signal.SIGCONT})["sent"]
    first.close()

    second = h.connect()
    welcome = second.hello(2)
    (agent,) = welcome["agents"]
    assert agent["id"] == "a" and agent["pid"] == pid and agent["returncode"] is None
    assert agent["out_base"] == acked
    assert _alive(pid)
    second.request({"op": "resume", "id": "a", "stream": "out", "offset": acked})
    offset, rest = second.read_stream("a", "out", b"done\n")
    expected = "".join(f"line {i}\n" for i in range(3, 2000)) + "done\n"
    assert (offset, rest) == (acked, expected.encode())
    # Its stdin never closed: it still reads.
    second.send({"op": "write", "id": "a"}, b"bye\n")
    assert second.wait_for("exited", "a")["returncode"] == 0


def test_an_offset_already_acknowledged_cannot_be_resumed(make_holder: Any, tmp_path: Path) -> None:
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    _spawn(daemon, "a", ECHO, tmp_path)
    daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    daemon.send({"op": "write", "id": "a"}, b"x\n")
    daemon.read_stream("a", "out", b"\n")
    daemon.send({"op": "ack", "id": "a", "stream": "out", "offset": 5})
    reply = daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 2})
    assert reply["kind"] == "offset_gone"
    reply = daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 99})
    assert reply["kind"] == "offset_gone"


def test_retained_output_is_bounded_and_the_agent_waits(make_holder: Any, tmp_path: Path) -> None:
    retain = 8192
    h = make_holder("--retain-bytes", str(retain))
    daemon = h.connect()
    daemon.hello(1)
    total = 1 << 20
    pid = _spawn(
        daemon,
        "a",
        _python(
            f"import sys\nsys.stdout.buffer.write(b'x' * {total}); sys.stdout.flush()\n"
            "sys.stdin.readline()\n"
        ),
        tmp_path,
    )
    daemon.close()  # nobody reads: the holder fills its bound, then the pipe
    # The holder fills its bound exactly and then retains no more, however long
    # the agent has more to write.
    epoch = 1
    retained = 0
    while retained < retain:
        epoch += 1
        second = h.connect()
        (agent,) = second.hello(epoch)["agents"]
        retained = agent["out_end"] - agent["out_base"]
        assert retained <= retain
        second.close()
    second = h.connect()
    (agent,) = second.hello(epoch + 1)["agents"]
    assert agent["out_end"] - agent["out_base"] == retain
    assert _alive(pid)
    second.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    received = 0
    while received < total:
        header, payload = second.next()
        if header["op"] == "out":
            assert header["offset"] == received
            received += len(payload)
            second.send({"op": "ack", "id": "a", "stream": "out", "offset": received})
    assert received == total


def test_a_window_bounds_the_relay_and_what_waited_comes_in_few_messages(
    make_holder: Any, tmp_path: Path
) -> None:
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    written = tmp_path / "written"
    lines = b"".join(b"line %d\n" % i for i in range(2000))
    _spawn(
        daemon,
        "a",
        _python(
            "import sys\n"
            "sys.stdin.readline()\n"
            f"sys.stdout.buffer.write({lines!r}); sys.stdout.flush()\n"
            f"open({str(written)!r}, 'w').close()\n"
            "sys.stdin.readline()\n"
        ),
        tmp_path,
    )
    for bad in ("100", True, 1.5):
        reply = daemon.request(
            {"op": "resume", "id": "a", "stream": "out", "offset": 0, "upto": bad}
        )
        assert reply["kind"] == "bad_request", bad
    reply = daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0, "upto": 100})
    assert reply["op"] == "ok"
    daemon.send({"op": "write", "id": "a"}, b"go\n")
    # Exactly the window's 100 bytes, then nothing while it stays where it is.
    head = bytearray()
    while len(head) < 100:
        header, payload = daemon.next()
        if header["op"] == "out":
            assert header["offset"] == len(head)
            head += payload
    assert head == lines[:100]
    _wait(written.exists)
    assert daemon.request({"op": "signal", "id": "a", "signal": signal.SIGCONT})["sent"]
    assert [m for m in daemon.pending if m[0]["op"] == "out"] == []
    # An ack with a bad upto is refused and changes nothing; one that moves it on
    # relays the rest: what waited in the holder and the pipe, in one message each.
    reply = daemon.request({"op": "ack", "id": "a", "stream": "out", "offset": 0, "upto": "x"})
    assert reply["kind"] == "bad_request"
    daemon.send({"op": "ack", "id": "a", "stream": "out", "offset": 100, "upto": 1 << 30})
    frames = []
    rest = bytearray()
    while len(rest) < len(lines) - 100:
        header, payload = daemon.next()
        if header["op"] == "out":
            assert header["offset"] == 100 + len(rest), "a gap or a duplicate"
            frames.append(len(payload))
            rest += payload
    assert head + rest == lines
    assert len(frames) <= 2, frames
    daemon.send({"op": "write", "id": "a"}, b"bye\n")
    assert daemon.wait_for("exited", "a")["returncode"] == 0


def test_a_frame_is_written_whole_even_when_the_daemon_dies_at_once(
    make_holder: Any, tmp_path: Path
) -> None:
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    size = 4 << 20  # far more than a pipe holds: the holder writes it over many wakeups
    _spawn(
        daemon,
        "a",
        _python(
            "import sys\n"
            "data = sys.stdin.buffer.readline()\n"
            "sys.stdout.write(f'{len(data)}\\n'); sys.stdout.flush()\n"
            "sys.stdin.readline()\n"
        ),
        tmp_path,
    )
    # Once the holder said "queued", the frame is the holder's to write, whole.
    reply = daemon.request({"op": "write", "id": "a"}, b"y" * (size - 1) + b"\n")
    assert reply["op"] == "queued"
    daemon.close()
    second = h.connect()
    second.hello(2)
    second.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    assert second.read_stream("a", "out", b"\n") == (0, f"{size}\n".encode())


def test_a_frame_still_arriving_when_another_daemon_attaches_is_dropped_whole(
    make_holder: Any, tmp_path: Path
) -> None:
    """Fencing: what the replaced daemon had not finished sending never reaches the
    agent, not even in part (its send is in flight: the unknown rule's case)."""
    h = make_holder()
    old = h.connect()
    old.hello(1)
    _spawn(
        old,
        "a",
        _python(
            "import sys\n"
            "data = sys.stdin.buffer.readline()\n"
            "sys.stdout.write(f'{data!r}\\n'); sys.stdout.flush()\n"
            "sys.stdin.readline()\n"
        ),
        tmp_path,
    )
    whole = holder.encode({"op": "write", "id": "a"}, b"z" * 1000 + b"\n")
    old.sock.sendall(whole[: len(whole) // 2])
    new = h.connect()
    new.hello(2)
    with contextlib.suppress(OSError):  # too late: it was cut off
        old.sock.sendall(whole[len(whole) // 2 :])
    new.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    new.send({"op": "write", "id": "a"}, b"fresh\n")
    assert new.read_stream("a", "out", b"\n") == (0, b"b'fresh\\n'\n")


def test_the_last_key_taken_is_reported_to_the_next_daemon(
    make_holder: Any, tmp_path: Path
) -> None:
    """Rule 3's keys: what the next daemon learns of the answers its predecessor
    wrote. A key is taken with its frame, or alone with an empty one (nothing reaches
    the agent); a refused write takes none; once a daemon that does not key wrote,
    an agent's key proves nothing and is no longer reported."""
    h = make_holder()
    first = h.connect()
    assert first.hello(1, keys=True)["agents"] == []
    _spawn(first, "a", ECHO, tmp_path)
    _spawn(first, "b", ECHO, tmp_path)
    _spawn(first, "c", ECHO, tmp_path)
    assert first.request({"op": "write", "id": "a", "key": "k1"}, b"one\n")["op"] == "queued"
    assert first.request({"op": "write", "id": "a", "key": "k2"})["op"] == "queued"
    first.request({"op": "write", "id": "a"}, b"two\n")
    first.request({"op": "write", "id": "c", "key": "c1"}, b"x\n")
    first.request({"op": "close_stdin", "id": "c"})
    refused = first.request({"op": "write", "id": "c", "key": "c2"}, b"y\n")
    assert refused["kind"] == "stdin_closed"
    first.close()

    second = h.connect()
    found = {a["id"]: a for a in second.hello(2, keys=True)["agents"]}
    assert {name: found[name]["stdin_key"] for name in "abc"} == {"a": "k2", "b": None, "c": "c1"}
    second.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    assert second.read_stream("a", "out", b"two") == (0, b"echo: one\necho: two\n")
    second.close()

    unkeyed = h.connect()
    assert all("stdin_key" not in a for a in unkeyed.hello(3)["agents"])
    _spawn(unkeyed, "d", ECHO, tmp_path)
    unkeyed.close()

    fourth = h.connect()
    fourth.hello(4, keys=True)
    _spawn(fourth, "e", ECHO, tmp_path)
    fourth.request({"op": "write", "id": "a", "key": "k3"}, b"three\n")
    fourth.request({"op": "write", "id": "d", "key": "d1"}, b"four\n")
    fourth.close()
    fifth = h.connect()
    found = {a["id"]: a for a in fifth.hello(5, keys=True)["agents"]}
    assert [name for name in sorted(found) if "stdin_key" in found[name]] == ["e"]
    assert found["e"]["stdin_key"] is None
    # A key past the bound, or not a string, is not kept and makes the rest unknown:
    # a welcome stays small whatever is written.
    _spawn(fifth, "f", ECHO, tmp_path)
    fifth.request({"op": "write", "id": "e", "key": "k" * (holder.MAX_KEY + 1)}, b"x\n")
    fifth.request({"op": "write", "id": "f", "key": 5}, b"y\n")
    fifth.close()
    found = {a["id"]: a for a in h.connect().hello(6, keys=True)["agents"]}
    assert not [name for name in found if "stdin_key" in found[name]]


def test_one_daemon_at_a_time_the_newest_epoch_wins(make_holder: Any, tmp_path: Path) -> None:
    h = make_holder()
    old = h.connect()
    old.hello(5)
    _spawn(old, "a", ECHO, tmp_path)
    new = h.connect()
    assert new.hello(6)["op"] == "welcome"
    # The old daemon is cut off at once: it can no longer act.
    with pytest.raises((EOFError, OSError)):
        old.request({"op": "signal", "id": "a", "signal": int(signal.SIGKILL)})
    stale = h.connect()
    reply = stale.hello(6)
    assert reply["kind"] == "fenced"
    with pytest.raises((EOFError, OSError)):
        stale.next()
    # The agent is untouched and the new daemon is still the one attached.
    new.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    new.send({"op": "write", "id": "a"}, b"still\n")
    assert new.read_stream("a", "out", b"\n") == (0, b"echo: still\n")


def test_a_daemon_that_detaches_and_closes_at_once_leaves_the_holder_serving(
    make_holder: Any, tmp_path: Path
) -> None:
    """The detach's answer meets a closed socket: the holder's failed send must not
    end the holder (it did: a daemon's clean exit crashed it, with its agents)."""
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    pid = _spawn(daemon, "a", ECHO, tmp_path)
    for epoch in range(2, 12):
        daemon.send({"op": "detach", "ref": 1})
        daemon.sock.shutdown(socket.SHUT_RDWR)
        daemon.close()
        daemon = h.connect()
        (agent,) = daemon.hello(epoch)["agents"]
        assert agent["pid"] == pid
    assert h.process.poll() is None
    daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    daemon.send({"op": "write", "id": "a"}, b"alive\n")
    assert daemon.read_stream("a", "out", b"\n") == (0, b"echo: alive\n")


def test_requests_before_hello_and_bad_input_are_refused(make_holder: Any, tmp_path: Path) -> None:
    h = make_holder()
    early = h.connect()
    reply = early.request({"op": "spawn", "id": "a", "argv": ECHO, "cwd": str(tmp_path), "env": {}})
    assert reply["kind"] == "not_attached"
    daemon = h.connect()
    daemon.hello(1)
    assert daemon.request({"op": "frobnicate"})["kind"] == "bad_request"
    assert daemon.request({"op": "write", "id": "nobody"})["kind"] == "unknown_agent"
    assert (
        daemon.request({"op": "spawn", "id": "b", "argv": [], "cwd": "/", "env": {}})["kind"]
        == "bad_request"
    )
    missing = daemon.request(
        {"op": "spawn", "id": "c", "argv": ["/nonexistent/agent"], "cwd": "/", "env": {}}
    )
    assert missing["kind"] == "spawn_failed" and missing["errno"] == 2
    assert (
        daemon.request({"op": "resume", "id": "c", "stream": "out", "offset": 0})["kind"]
        == "unknown_agent"
    )
    garbage = h.connect()
    garbage.sock.sendall(holder.HEADER.pack(3, 0) + b"{{{")
    header, _ = garbage.next()
    assert header["kind"] == "protocol"
    huge = h.connect()
    huge.sock.sendall(holder.HEADER.pack(holder.MAX_HEADER + 1, 0))
    assert huge.next()[0]["kind"] == "protocol"
    # None of it disturbed the attached daemon.
    assert (
        daemon.request({"op": "resume", "id": "x", "stream": "out", "offset": 0})["kind"]
        == "unknown_agent"
    )


def test_exit_status_is_reported_and_signals_reach_the_group(
    make_holder: Any, tmp_path: Path
) -> None:
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    _spawn(daemon, "three", _python("import sys; sys.exit(3)"), tmp_path)
    assert daemon.wait_for("exited", "three")["returncode"] == 3
    assert daemon.request({"op": "forget", "id": "three"})["op"] == "ok"
    _spawn(daemon, "term", ECHO, tmp_path)
    assert daemon.request({"op": "forget", "id": "term"})["kind"] == "running"
    assert daemon.request({"op": "signal", "id": "term", "signal": int(signal.SIGTERM)})["sent"]
    assert daemon.wait_for("exited", "term")["returncode"] == -signal.SIGTERM
    # Once reaped, its group id is no longer ours to signal.
    assert not daemon.request({"op": "signal", "id": "term", "signal": 9})["sent"]
    _spawn(daemon, "eof", ECHO, tmp_path)
    daemon.request({"op": "close_stdin", "id": "eof"})
    assert daemon.wait_for("exited", "eof")["returncode"] == 0


def test_what_an_agent_leaves_behind_is_reparented_to_the_holder_and_reaped(
    make_holder: Any, tmp_path: Path
) -> None:
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    _spawn(daemon, "a", ["/bin/sh", "-c", "sleep 300 & echo $!"], tmp_path)
    daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    _, out = daemon.read_stream("a", "out", b"\n")
    orphan = int(out)
    assert daemon.wait_for("exited", "a")["returncode"] == 0
    _wait(lambda: holder.parent_pid(orphan) == h.process.pid)
    os.kill(orphan, signal.SIGKILL)
    _wait(lambda: not Path(f"/proc/{orphan}").exists())  # reaped, not a zombie


def test_agents_and_token_carriers_may_not_connect(make_holder: Any, tmp_path: Path) -> None:
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    connect = _python(
        "import socket, struct, json, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "hl, pl = struct.unpack('>II', s.recv(8, socket.MSG_WAITALL))\n"
        "print(json.loads(s.recv(hl, socket.MSG_WAITALL))['op'])\n"
    )
    # An agent, and a process it started in a new session of its own.
    _spawn(daemon, "a", [*connect, str(h.path)], tmp_path)
    daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    assert daemon.read_stream("a", "out", b"\n") == (0, b"refused\n")
    _spawn(daemon, "b", ["setsid", "-w", *connect, str(h.path)], tmp_path)
    daemon.request({"op": "resume", "id": "b", "stream": "out", "offset": 0})
    assert daemon.read_stream("b", "out", b"\n") == (0, b"refused\n")
    # Anything with a spawn token in its environment, wherever it runs.
    env = {**os.environ, procfs.SPAWN_TOKEN_ENV: "0" * 32}
    result = subprocess.run(
        [*connect, str(h.path)], env=env, capture_output=True, timeout=TIMEOUT_S, check=True
    )
    assert result.stdout == b"refused\n"
    # The daemon stayed attached through all of it.
    assert daemon.request({"op": "forget", "id": "a"})["op"] in ("ok", "error")


def test_the_holder_leaves_when_it_holds_nothing(make_holder: Any, tmp_path: Path) -> None:
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    _spawn(daemon, "a", _python("pass"), tmp_path)
    daemon.wait_for("exited", "a")
    daemon.close()
    # It still holds the exited agent's status for the next daemon.
    second = h.connect()
    (agent,) = second.hello(2)["agents"]
    assert agent["returncode"] == 0 and agent["out_eof"]
    second.request({"op": "forget", "id": "a"})
    assert second.request({"op": "detach"})["op"] == "detached"
    assert h.process.wait(TIMEOUT_S) == 0


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_holder_no_daemon_can_reach_ends_its_agents_and_leaves(
    make_holder: Any, tmp_path: Path, how: str
) -> None:
    """Rule 6: its socket's path deleted (the state directory removed) or taken by
    another socket: no daemon can ever claim its agents, so it ends them and what
    they left behind in a session of their own, and exits, instead of holding them
    for ever. A holder whose path still leads to it keeps them (the other tests)."""
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    agent = _spawn(
        daemon, "a", ["/bin/sh", "-c", "setsid sleep 300 & echo $!; sleep 300"], tmp_path
    )
    daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    _, out = daemon.read_stream("a", "out", b"\n")
    escaped = int(out)
    assert daemon.request({"op": "detach"})["op"] == "detached"
    daemon.close()
    assert _alive(agent) and _alive(escaped)
    h.path.unlink()
    if how == "replaced":
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(str(h.path))
        other.close()
    assert h.process.wait(TIMEOUT_S + holder.ORPHAN_CHECK_S + holder.ORPHAN_END_S) == 0
    _wait(lambda: not _alive(agent) and not _alive(escaped))


def test_a_holder_nobody_attaches_to_leaves_after_its_idle_bound(make_holder: Any) -> None:
    h = make_holder("--idle-exit-s", "0.2")
    assert h.process.wait(TIMEOUT_S) == 0


def test_the_holder_is_standard_library_only() -> None:
    source = HOLDER.read_text()
    code = (
        "import sys, runpy; sys.argv = ['holder', '--help']\n"
        f"try: runpy.run_path({str(HOLDER)!r}, run_name='__main__')\n"
        "except SystemExit: pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('agentsd', 'trio', 'msgspec', 'attrs')))))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", "import json\n" + code],
        capture_output=True,
        check=True,
        timeout=TIMEOUT_S,
    )
    assert json.loads(result.stdout.splitlines()[-1]) == []
    assert "import agentsd" not in source and "from agentsd" not in source


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["int", "str", "none", "bool", "float", "list", "dict"][: 7 if depth < 2 else 5]
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.choice([0, -1, 1, 2**31, -(2**63), 10**30, rng.randint(-5, 5)])
    if kind == "str":
        return rng.choice(["", "a", "out", "err", "x" * 300, "\udcff", "\0"])
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "float":
        return rng.choice([0.5, -1.0, 1e308])
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {
        rng.choice(["id", "op", "argv", "env", "cwd"]): _random_value(rng, depth + 1)
        for _ in range(rng.randint(0, 3))
    }


def test_random_requests_never_end_the_holder_or_its_agents(
    make_holder: Any, tmp_path: Path
) -> None:
    """Whatever the daemon (or anything else) sends, the holder goes on holding: its
    death would take every agent's pipes. Requests never name the held agent, so
    nothing here may legitimately end it."""
    rng = random.Random(20261201)
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    pid = _spawn(daemon, "a", ECHO, tmp_path)
    ops = [*holder.AGENT_OPS, "spawn", "hello", "detach", "frobnicate", 7, None]
    epoch = 1
    for _ in range(300):
        header = {
            key: _random_value(rng)
            for key in rng.sample(
                ["id", "stream", "offset", "signal", "argv", "cwd", "env", "epoch", "protocol"], 3
            )
        }
        header["op"] = rng.choice(ops)
        if header.get("id") == "a":
            header["id"] = "b"
        if header["op"] in ("spawn", "hello"):
            header["op"] = "ack"  # a spawn could start anything; a hello would re-attach
        with contextlib.suppress(OSError):
            daemon.sock.sendall(_frame(header, rng))
        if rng.random() < 0.1:  # garbage on a connection of its own
            other = h.connect()
            with contextlib.suppress(OSError):
                other.sock.sendall(rng.randbytes(rng.randint(1, 64)))
            other.close()
        if rng.random() < 0.05 or daemon.sock.fileno() < 0:
            daemon.close()
            epoch += 1
            daemon = h.connect()
            daemon.hello(epoch)
    assert h.process.poll() is None
    # Every bad request was refused as such, none met a bug (the safety net).
    assert "Traceback" not in h.errors.read_text()
    epoch += 1
    final = h.connect()
    (agent,) = final.hello(epoch)["agents"]
    assert agent["pid"] == pid and agent["returncode"] is None
    final.request({"op": "resume", "id": "a", "stream": "out", "offset": agent["out_base"]})
    final.send({"op": "write", "id": "a"}, b"still here\n")
    _, out = final.read_stream("a", "out", b"still here\n")
    assert out.endswith(b"echo: still here\n")


def _frame(header: dict[str, Any], rng: random.Random) -> bytes:
    try:
        head = json.dumps(header).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        head = b"{}"
    payload = rng.randbytes(rng.choice([0, 0, 1, 100]))
    return holder.HEADER.pack(len(head), len(payload)) + head + payload


def test_a_socket_connected_by_an_agents_exited_child_is_refused(
    make_holder: Any, tmp_path: Path
) -> None:
    """An agent's child connect()s and exits, the agent reaps it and says hello on
    the socket with the highest epoch: the holder must refuse the socket (the peer
    is gone, nothing vouches for it), never attach it in place of the daemon."""
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    go, connected = tmp_path / "go", tmp_path / "connected"
    attacker = _python(
        "import json, os, socket, struct, sys, time\n"
        "path, go, connected, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])\n"
        "def attempt():\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        s.connect(path); os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
        "    return s\n"
        "def hello(s):\n"
        "    head = json.dumps({'op': 'hello', 'protocol': 1, 'epoch': 10**30, 'ref': 0})\n"
        "    try:\n"
        "        s.sendall(struct.pack('>II', len(head), 0) + head.encode())\n"
        "        hl, pl = struct.unpack('>II', s.recv(8, socket.MSG_WAITALL))\n"
        "        return json.loads(s.recv(hl, socket.MSG_WAITALL))['op']\n"
        "    except (OSError, struct.error):\n"
        "        return 'closed'\n"
        "    finally:\n"
        "        s.close()\n"
        "while not os.path.exists(go):\n"
        "    time.sleep(0.01)\n"
        "s = attempt()  # the holder is stopped: it accepts once the child is reaped\n"
        "open(connected, 'w').close()\n"
        "ops = [hello(s)] + [hello(attempt()) for _ in range(rounds)]\n"
        "print(ops.count('welcome'), 'welcome of', len(ops), flush=True)\n"
    )
    _spawn(daemon, "a", [*attacker, str(h.path), str(go), str(connected), "100"], tmp_path)
    daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    os.kill(h.process.pid, signal.SIGSTOP)
    try:
        go.touch()
        _wait(connected.exists)
    finally:
        os.kill(h.process.pid, signal.SIGCONT)
    # Refused ("refused", or the holder's close already) every time.
    assert daemon.read_stream("a", "out", b"\n") == (0, b"0 welcome of 101\n")
    # The daemon stayed attached through all of it.
    assert daemon.request({"op": "close_stdin", "id": "a"})["op"] == "ok"


def test_a_spawn_exec_cannot_take_is_that_spawns_error_only(
    make_holder: Any, tmp_path: Path
) -> None:
    """A NUL byte in argv, environment or cwd (Popen's ValueError) is the spawn's
    error reply: no pipe end leaks and the daemon stays attached."""
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    pid = _spawn(daemon, "a", ECHO, tmp_path)
    daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})
    fds = len(os.listdir(f"/proc/{h.process.pid}/fd"))
    env = dict(os.environ)
    for i, (argv, cwd, extra) in enumerate(
        [
            (["sleep", "6\x000"], str(tmp_path), {}),
            (["true"], str(tmp_path), {"X": "a\x00b"}),
            (["true"], str(tmp_path) + "\x00x", {}),
        ]
    ):
        reply = daemon.request(
            {"op": "spawn", "id": f"bad{i}", "argv": argv, "cwd": cwd, "env": {**env, **extra}}
        )
        assert reply["op"] == "error" and reply["kind"] == "bad_request", reply
    assert len(os.listdir(f"/proc/{h.process.pid}/fd")) == fds
    daemon.request({"op": "write", "id": "a"}, b"still here\n")
    assert daemon.read_stream("a", "out", b"\n") == (0, b"echo: still here\n")
    assert _alive(pid)


def test_an_agent_writing_in_bulk_keeps_no_other_agents_output_waiting(
    make_holder: Any, tmp_path: Path
) -> None:
    """Rule 2's relay: "a" writes without end into a 1 MiB pipe, so every read of
    it fills a whole frame and the daemon's socket with it; each line "b" echoes
    still goes out among "a"'s frames, not after them."""
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    _spawn(
        daemon,
        "a",
        _python(
            "import fcntl, os\n"
            "fcntl.fcntl(1, 1031, 1 << 20)  # F_SETPIPE_SZ: what any agent may do\n"
            "block = b'x' * (1 << 20)\n"
            "while True:\n"
            "    os.write(1, block)\n"
        ),
        tmp_path,
    )
    _spawn(daemon, "b", ECHO, tmp_path)
    for agent in ("a", "b"):
        reply = daemon.request({"op": "resume", "id": agent, "stream": "out", "offset": 0})
        assert reply["op"] == "ok"
    flooded = 0
    while flooded < 4 << 20:  # "a"'s relay is under way
        header, payload = daemon.next()
        if header["op"] == "out" and header["id"] == "a":
            flooded += len(payload)
            daemon.send({"op": "ack", "id": "a", "stream": "out", "offset": flooded})
    # Each line of "b" goes out within a few of "a"'s frames, not after its flood:
    # a relay that framed "a" first at every turn would keep "b" waiting whenever
    # "a" had a whole frame ready, so several lines are sent, one after another.
    for n in range(5):
        daemon.send({"op": "write", "id": "b"}, b"line %d\n" % n)
        before = flooded
        while True:
            header, payload = daemon.next()
            if header["op"] != "out":
                continue
            if header["id"] == "b":
                assert payload == b"echo: line %d\n" % n
                break
            flooded += len(payload)
            daemon.send({"op": "ack", "id": "a", "stream": "out", "offset": flooded})
            # Bounded by bytes, not time. Measured: 0.5-1.5 MiB of "a" came first
            # with the turns, 9-250 MiB when "a" was framed first at every pump.
            assert flooded - before < 16 << 20, "b's line waits behind a's flood"
    assert daemon.request({"op": "signal", "id": "a", "signal": signal.SIGKILL})["sent"]
