"""Hostile clients against a real daemon: many idle connections, a subscriber that
never reads a flooding session, half-sent frames (slowloris), and a client that
pipelines ten thousand requests without reading a reply (DESIGN.md invariant 8).

During every attack a control connection (``PingProbe``) keeps getting every
``daemon.ping`` answered (counted, not timed), the daemon's resident memory
(VmRSS) stays within the bound written beside each test, and every offender is cut
off with its reason in the daemon's log.

The daemons here run with test-sized timeouts (``FRAME_TIMEOUT_S``,
``SEND_TIMEOUT_S``) so an offender is cut within seconds; the defaults (10 s and
30 s, ``agentsd.config``) only change how long an offender holds its connection.
Each test starts its own daemon, so each memory baseline is its own.
"""

from __future__ import annotations

import contextlib
import re
import resource
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsd.connection import MAX_OUTBOUND_BYTES
from agentsd.sink import MAX_ITEM_TEXT_CHARS
from agentsd_protocol.framing import Framing, encode_frame
from tests.daemon_process import IO_TIMEOUT_S, POLL_S, DaemonProcess, WireClient, make_temp_dir
from tests.daemon_process import running_daemon as start_daemon
from tests.e2e.reliability import (
    PingProbe,
    replies_until_closed,
    report,
    sized,
    vm_rss_kib,
    wait_until,
)

FRAME_TIMEOUT_S = 1.0
SEND_TIMEOUT_S = 2.0
CUT_OFF_S = 30.0  # how long an offender may take to be cut off, with a loaded machine's slack
KIB = 1024
MIB = 1024 * KIB

# What one connection may cost the daemon: it was measured at about 15 KiB (a trio
# task and its nurseries, a memory channel, a socket, a frame decoder); four times
# that leaves room for allocator slack without hiding a leak of a buffer per client.
CONNECTION_BOUND_KIB = 64


@pytest.fixture(scope="module", autouse=True)
def enough_file_descriptors() -> Iterator[None]:
    """Thousands of client sockets live in this process: take the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = sized(1000, 3000) + 100
    raised = hard if hard == resource.RLIM_INFINITY or hard >= needed else needed
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, raised))
    except (ValueError, OSError) as exc:  # a hard limit below it, and no privilege
        pytest.skip(f"cannot raise RLIMIT_NOFILE to {needed} (hard limit {hard}): {exc}")
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, max(hard, raised)))


@contextlib.contextmanager
def hostile_daemon() -> Iterator[tuple[DaemonProcess, PingProbe, WireClient]]:
    """A daemon with test-sized timeouts, its control probe, and a client for the test."""
    base = make_temp_dir()
    config = base / "hostile.toml"
    config.write_text(f"frame_timeout_s = {FRAME_TIMEOUT_S}\nsend_timeout_s = {SEND_TIMEOUT_S}\n")
    try:
        with (
            start_daemon(extra_args=["--config", str(config)]) as daemon,
            PingProbe(daemon.socket) as probe,
            daemon.connect() as client,
        ):
            client.ping()
            wait_until(lambda: probe.pings > 0, IO_TIMEOUT_S, "the control probe answers")
            yield daemon, probe, client
            probe.check()
            assert "Traceback" not in daemon.log(), daemon.log()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def connections(client: WireClient) -> int:
    count: int = client.call("daemon.status")["result"]["connections"]
    return count


# The probe's and the test's own connection.
BYSTANDERS = 2
# What the daemon logs when it cuts a client that does not read (agentsd.connection).
NOT_READING = re.compile(r"closing connection \d+: client (accepted no bytes|is not reading)")


class Rss:
    """The daemon's VmRSS: a baseline, then the peak of every sample after it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.baseline_kib = vm_rss_kib(pid)
        self.peak_kib = self.baseline_kib

    def sample(self) -> None:
        self.peak_kib = max(self.peak_kib, vm_rss_kib(self.pid))

    @property
    def growth_kib(self) -> int:
        return self.peak_kib - self.baseline_kib

    def check(self, bound_kib: int, why: str) -> str:
        """Assert the growth is within ``bound_kib``; a line for the report."""
        assert self.growth_kib <= bound_kib, (
            f"the daemon grew by {self.growth_kib} KiB (from {self.baseline_kib} KiB), "
            f"beyond the {bound_kib} KiB bound ({why})"
        )
        return f"VmRSS +{self.growth_kib / KIB:.1f} MiB (bound {bound_kib / KIB:.0f} MiB)"


def open_clients(path: Path, count: int) -> list[socket.socket]:
    """``count`` connected sockets. A connect with a timeout fails with EAGAIN while
    the listen backlog (``LISTEN_BACKLOG``) is full, so it is retried until the daemon
    accepts."""
    out: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            out.append(sock)
            sock.settimeout(IO_TIMEOUT_S)
            deadline = time.monotonic() + IO_TIMEOUT_S
            while True:
                try:
                    sock.connect(str(path))
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(POLL_S)
    except BaseException:
        for sock in out:
            sock.close()
        raise
    return out


def log_count(daemon: DaemonProcess, needle: str) -> int:
    return daemon.log().count(needle)


# ---- 1,000 idle connections ------------------------------------------------------------


def test_a_thousand_idle_connections_cost_little_and_block_nobody() -> None:
    """Idle connections are legitimate (an editor's, a status bar's watch) and are
    never cut; they are bounded by ``MAX_CONNECTIONS`` (4096) instead. What they may
    cost: ``CONNECTION_BOUND_KIB`` each."""
    count = sized(1000, 3000)
    with hostile_daemon() as (daemon, probe, client):
        rss = Rss(daemon.process.pid)
        started = time.monotonic()
        idle = open_clients(daemon.socket, count)
        try:
            opened_s = time.monotonic() - started

            def all_accepted() -> bool:
                rss.sample()
                return connections(client) >= count + BYSTANDERS

            wait_until(all_accepted, CUT_OFF_S, f"the daemon accepts {count} connections")
            rss.sample()
            # Somebody else is served meanwhile: a whole session's life, not just pings.
            cwd = make_temp_dir()
            try:
                created = client.call(
                    "agentSession.create", {"provider": "mock", "cwd": str(cwd), "start": False}
                )
                session_id = created["result"]["sessionId"]
                assert "result" in client.call("agentSession.get", {"sessionId": session_id})
                assert "result" in client.call("agentSession.delete", {"sessionId": session_id})
            finally:
                shutil.rmtree(cwd, ignore_errors=True)
            probe.check()
            memory = rss.check(count * CONNECTION_BOUND_KIB, f"{CONNECTION_BOUND_KIB} KiB each")
        finally:
            for sock in idle:
                sock.close()
        wait_until(lambda: connections(client) == BYSTANDERS, CUT_OFF_S, "the idle connections end")
        assert "closing connection" not in daemon.log(), "an idle connection was cut"
        report(
            "hostile",
            f"{count} idle connections (opened in {opened_s:.1f} s): {memory}, "
            f"{rss.growth_kib / count:.1f} KiB each; {probe.summary()}",
        )


# ---- a subscriber that never reads a flooding session ------------------------------------


def test_a_subscriber_that_never_reads_a_flooding_session_is_cut_off() -> None:
    """The offender subscribes, reads its subscribe reply, then never reads again while
    the mock agent floods deltas. Its subscription lags (it is told ``lagged`` and
    dropped) or its connection is cut when its socket takes nothing for
    ``SEND_TIMEOUT_S``; either way the log says so.

    Bound: one connection's outbound queue (``MAX_OUTBOUND_BYTES``, 16 MiB, the most
    the daemon ever holds for one client) plus the flood's streamed item text, kept to
    ``MAX_ITEM_TEXT_CHARS`` (1 Mi) characters and held as one string per delta (a
    pointer each: these deltas are one cached character), plus 8 MiB of slack.
    """
    deltas = sized(100_000, 1_000_000)
    bound_kib = (MAX_OUTBOUND_BYTES + MAX_ITEM_TEXT_CHARS * (8 + 1) + 8 * MIB) // KIB
    cwd = make_temp_dir()
    try:
        with hostile_daemon() as (daemon, probe, client):
            created = client.call(
                "agentSession.create",
                {
                    "provider": "mock",
                    "cwd": str(cwd),
                    "options": {"floodStdout": deltas, "chunks": 1},
                },
            )
            session_id = created["result"]["sessionId"]
            rss = Rss(daemon.process.pid)
            with WireClient(daemon.socket) as offender:
                reply = offender.call("agentSession.subscribe", {"sessionId": session_id})
                subscription = reply["result"]["subscriptionId"]
                # From here on the offender reads nothing.
                sent = client.call("agentSession.send", {"sessionId": session_id, "text": "go"})
                assert sent["result"]["dispatch"] == "accepted", sent
                started = time.monotonic()
                lagged = f"subscription {subscription} on {session_id} lagged"

                def cut_off() -> bool:
                    rss.sample()
                    if lagged in daemon.log():
                        return True
                    return connections(client) == BYSTANDERS and bool(
                        NOT_READING.search(daemon.log())
                    )

                wait_until(cut_off, CUT_OFF_S, "the non-reading subscriber is cut off")
                cut_s = time.monotonic() - started
                how = "lagged and dropped" if lagged in daemon.log() else "disconnected"

                def flood_over() -> bool:
                    rss.sample()
                    session = client.call("agentSession.get", {"sessionId": session_id})
                    return bool(session["result"]["session"]["status"] == "idle")

                wait_until(flood_over, CUT_OFF_S * 2, "the flooding turn completes")
                probe.check()
                memory = rss.check(bound_kib, "one client's outbound bound plus the flood's text")
                if how == "lagged and dropped":
                    # What the offender finds when it finally reads: what it was sent,
                    # ending in ``lagged`` with the seq to resume after.
                    note = offender.recv()
                    while note.get("method") != "agentSession.lagged":
                        note = offender.recv()
                    assert note["params"]["subscriptionId"] == subscription, note
                    assert isinstance(note["params"]["resumeAfterSeq"], int), note
            history = client.call(
                "agentSession.history", {"sessionId": session_id, "beforeSeq": 2**62}
            )
            assert history["result"]["events"][-1]["kind"] in ("turn.completed", "item.completed")
            report(
                "hostile",
                f"non-reading subscriber of a {deltas}-delta flood: {how} after {cut_s:.1f} s; "
                f"{memory}; {probe.summary()}",
            )
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


# ---- slowloris: frames that never finish -----------------------------------------------------

HALF_FRAMES = [
    b"Content-Length: 1048576\r\n\r\n" + b'{"jsonrpc":"2.0",',  # promises 1 MiB, sends 17 bytes
    b"Content-Length: 1048576\r\n\r\n",  # the header alone
    b"Content-Le",  # not even a whole header
    b'{"jsonrpc":"2.0","id":1,"method":"daemon.pi',  # an NDJSON line that never ends
]


def test_half_sent_frames_are_cut_after_the_frame_timeout() -> None:
    """Slowloris: every connection starts a frame and stalls. A frame must be complete
    within ``frame_timeout_s`` of waiting on its client, so each is told so (a
    ``parse_error`` with id null) and closed; until then each costs about what an
    idle connection costs (the few bytes it sent are all that is buffered)."""
    count = sized(1000, 3000)
    with hostile_daemon() as (daemon, probe, client):
        rss = Rss(daemon.process.pid)
        stalled = open_clients(daemon.socket, count)
        try:
            started = time.monotonic()
            for i, sock in enumerate(stalled):
                sock.sendall(HALF_FRAMES[i % len(HALF_FRAMES)])

            def all_cut() -> bool:
                rss.sample()
                return connections(client) == BYSTANDERS

            wait_until(all_cut, CUT_OFF_S, f"the {count} stalled connections are cut")
            cut_s = time.monotonic() - started
            assert cut_s >= FRAME_TIMEOUT_S, f"cut after {cut_s:.2f} s, before the timeout"
            for i, sock in enumerate(stalled):
                frames = replies_until_closed(sock)
                assert len(frames) == 1, (HALF_FRAMES[i % len(HALF_FRAMES)], frames)
                error = frames[0]["error"]
                assert frames[0]["id"] is None, frames
                assert error["data"]["kind"] == "parse_error", frames
                assert "unfinished" in error["message"], frames
        finally:
            for sock in stalled:
                sock.close()
        assert log_count(daemon, "a frame was left unfinished") >= count
        probe.check()
        memory = rss.check(count * CONNECTION_BOUND_KIB, f"{CONNECTION_BOUND_KIB} KiB each")
        report(
            "hostile",
            f"{count} half-sent frames: all cut {cut_s:.1f} s after they stalled "
            f"(frame timeout {FRAME_TIMEOUT_S:g} s); {memory}; {probe.summary()}",
        )


@pytest.mark.parametrize("framing", list(Framing), ids=lambda f: f.value)
def test_a_slow_but_steady_writer_is_never_cut(framing: Framing) -> None:
    """The frame timeout counts the wait for one frame, not a connection's life: a
    client that streams frames for longer than the timeout, every chunk splitting a
    frame, is served in full."""
    pings = 600
    stream = b"".join(
        encode_frame(framing, b'{"jsonrpc":"2.0","id":%d,"method":"daemon.ping"}' % i)
        for i in range(pings)
    )
    chunk = 997  # prime: every boundary falls inside a frame somewhere
    pause_s = FRAME_TIMEOUT_S * 3 / (len(stream) / chunk)  # the stream lasts 3 timeouts
    with hostile_daemon() as (daemon, _probe, _client), WireClient(daemon.socket, framing) as slow:
        started = time.monotonic()
        for offset in range(0, len(stream), chunk):
            slow.send_raw(stream[offset : offset + chunk])
            time.sleep(pause_s)  # the slow writer itself, not a wait for the daemon
        took = time.monotonic() - started
        ids = {slow.recv()["id"] for _ in range(pings)}
        assert ids == set(range(pings))
        assert took > FRAME_TIMEOUT_S * 2
        assert "closing connection" not in daemon.log()


# ---- ten thousand requests, no reads ------------------------------------------------------


def test_ten_thousand_requests_without_reading_cut_only_that_client() -> None:
    """The offender pipelines 10,000 requests and reads nothing. The daemon keeps
    reading (so the offender never blocks it) and queues replies until the
    per-connection bound (4096 messages or 16 MiB), then cuts it off.

    Bound: that one connection's outbound queue (``MAX_OUTBOUND_BYTES``) plus up to
    64 requests in flight and the 64 KiB read buffer: 24 MiB in all.
    """
    requests = 10_000
    bound_kib = (MAX_OUTBOUND_BYTES + 8 * MIB) // KIB
    bodies = [
        b'{"jsonrpc":"2.0","id":%d,"method":"daemon.status"}',
        b'{"jsonrpc":"2.0","id":%d,"method":"agentSession.get","params":{"sessionId":"nope"}}',
        b'{"jsonrpc":"2.0","id":%d,"method":"agentSession.history","params":{"sessionId":"x"}}',
    ]
    stream = b"".join(
        encode_frame(Framing.NDJSON, bodies[i % len(bodies)] % i) for i in range(requests)
    )
    with hostile_daemon() as (daemon, probe, client):
        rss = Rss(daemon.process.pid)
        with WireClient(daemon.socket) as offender:
            started = time.monotonic()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                offender.send_raw(stream)

            def cut_off() -> bool:
                rss.sample()
                return connections(client) == BYSTANDERS

            wait_until(cut_off, CUT_OFF_S, "the client that reads nothing is cut off")
            cut_s = time.monotonic() - started
        reason = "client is not reading its replies"
        assert reason in daemon.log(), daemon.log()
        probe.check()
        memory = rss.check(bound_kib, "one client's outbound bound plus in-flight requests")
        report(
            "hostile",
            f"{requests} requests never read: cut after {cut_s:.1f} s ({reason}); {memory}; "
            f"{probe.summary()}",
        )
