"""JSON-RPC 2.0 against a real daemon over a real socket, in both framings.

Every socket operation is bounded by the client's timeout (``IO_TIMEOUT_S``) and every
daemon start and stop by its own deadline.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import time
from typing import Any

import msgspec
import pytest

from agentsd_protocol.framing import Framing, encode_frame
from tests.daemon_process import IO_TIMEOUT_S, POLL_S, DaemonProcess, WireClient
from tests.e2e.conftest import SMALL_MAX_FRAME_BYTES, assert_error
from tests.protocol.test_openrpc import check_openrpc_document

PING = {"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"}


def enc(value: Any) -> bytes:
    return msgspec.json.encode(value)


def test_ping_in_each_framing_and_replies_use_it(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        client.send(PING)
        expected = encode_frame(framing, enc({"jsonrpc": "2.0", "id": 1, "result": {"pong": True}}))
        raw = b""
        while len(raw) < len(expected) and (chunk := client.sock.recv(65536)):
            raw += chunk
        assert raw == expected


def test_whitespace_before_the_first_frame_is_ignored(
    daemon: DaemonProcess, framing: Framing
) -> None:
    with daemon.connect(framing) as client:
        client.send_raw(b"\r\n \n\t")
        client.ping()


def test_parse_error_keeps_the_connection(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        client.send_body(b'{"jsonrpc": "2.0", "id": 9, "method": "daemon.ping"')
        reply = client.recv()
        assert_error(reply, -32700, "parse_error")
        assert reply["id"] is None
        client.ping()


@pytest.mark.parametrize(
    ("message", "expected_id"),
    [
        pytest.param({"jsonrpc": "2.0", "id": 5, "method": 1}, 5, id="method-not-string"),
        pytest.param({"jsonrpc": "1.0", "id": "a", "method": "daemon.ping"}, "a", id="version"),
        pytest.param({"jsonrpc": "2.0", "id": True, "method": "daemon.ping"}, None, id="bool-id"),
        pytest.param(
            {"jsonrpc": "2.0", "id": 6, "method": "daemon.ping", "params": 3}, 6, id="params-scalar"
        ),
        pytest.param({"method": "daemon.ping", "id": 7}, 7, id="no-version"),
    ],
)
def test_invalid_request(
    daemon: DaemonProcess, framing: Framing, message: Any, expected_id: Any
) -> None:
    with daemon.connect(framing) as client:
        client.send(message)
        reply = client.recv()
        assert_error(reply, -32600, "invalid_request")
        assert reply["id"] == expected_id
        client.ping()


def test_empty_batch_is_one_invalid_request(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        client.send_body(b"[]")
        reply = client.recv()
        assert isinstance(reply, dict), "an empty batch gets one object, not an array"
        assert_error(reply, -32600, "invalid_request")
        assert reply["id"] is None
        client.ping()


def test_notifications_get_no_reply(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        # A notification, a notification batch, and notifications that fail: none of
        # them may produce a single byte, so the next reply must be the ping's.
        client.send({"jsonrpc": "2.0", "method": "daemon.ping"})
        client.send([{"jsonrpc": "2.0", "method": "daemon.ping"}] * 3)
        client.send({"jsonrpc": "2.0", "method": "no.such.method"})
        client.send({"jsonrpc": "2.0", "method": "daemon.ping", "params": {"bogus": 1}})
        client.send(
            [{"jsonrpc": "2.0", "method": "no.such.method"}, {"jsonrpc": "2.0", "method": "x"}]
        )
        client.ping()


def test_mixed_batch_gets_an_array_of_replies(daemon: DaemonProcess, framing: Framing) -> None:
    batch: list[Any] = [
        {"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"},
        {"jsonrpc": "2.0", "method": "daemon.ping"},
        {"jsonrpc": "2.0", "id": "two", "method": "no.such.method"},
        1,
        {"foo": "bar"},
        {"jsonrpc": "2.0", "id": 3, "method": "daemon.ping", "params": ["positional"]},
        {"jsonrpc": "2.0", "id": 4, "method": "daemon.status"},
    ]
    with daemon.connect(framing) as client:
        client.send(batch)
        replies = client.recv()
        assert isinstance(replies, list)
        assert len(replies) == 6  # all but the notification
        by_id: dict[Any, list[Any]] = {}
        for reply in replies:
            by_id.setdefault(reply["id"], []).append(reply)
        assert by_id[1] == [{"jsonrpc": "2.0", "id": 1, "result": {"pong": True}}]
        assert_error(by_id["two"][0], -32601, "method_not_found")
        assert [assert_error(r, -32600, "invalid_request")["code"] for r in by_id[None]] == [
            -32600,
            -32600,
        ]
        assert_error(by_id[3][0], -32602, "invalid_params")
        assert by_id[4][0]["result"]["pid"] == daemon.process.pid
        client.ping()


def test_unknown_method(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        reply = client.call("no.such.method", {})
        error = assert_error(reply, -32601, "method_not_found")
        assert "no.such.method" in error["message"]


def test_params_as_an_array_are_invalid_params(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        assert_error(client.call("daemon.ping", []), -32602, "invalid_params")


def test_unknown_params_field_is_named(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        error = assert_error(
            client.call("daemon.ping", {"bogusField": 1}), -32602, "invalid_params"
        )
        assert "bogusField" in error["message"]


@pytest.mark.parametrize(
    ("method", "params", "path"),
    [
        (
            "agentSession.create",
            {"provider": "mock", "cwd": "/tmp", "command": ["x", 1]},
            "$.command[1]",
        ),
        ("agentSession.create", {"provider": "mock", "cwd": "/tmp", "env": {"A": 1}}, "$.env"),
        ("agentSession.list", {"state": "bogus"}, "$.state"),
    ],
)
def test_a_wrong_type_deep_in_params_names_its_path(
    daemon: DaemonProcess, framing: Framing, method: str, params: Any, path: str
) -> None:
    with daemon.connect(framing) as client:
        error = assert_error(client.call(method, params), -32602, "invalid_params")
        assert path in error["message"]


def test_requests_pipelined_on_one_connection_are_all_answered(
    daemon: DaemonProcess, framing: Framing
) -> None:
    with daemon.connect(framing) as client:
        client.send_raw(
            b"".join(
                encode_frame(framing, enc({"jsonrpc": "2.0", "id": i, "method": "daemon.ping"}))
                for i in range(200)
            )
        )
        ids = {client.recv()["id"] for _ in range(200)}
        assert ids == set(range(200))


def test_half_close_still_gets_the_reply(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        client.send(PING)
        client.sock.shutdown(socket.SHUT_WR)
        frames = client.recv_until_closed()
        assert [msgspec.json.decode(f) for f in frames] == [
            {"jsonrpc": "2.0", "id": 1, "result": {"pong": True}}
        ]


def test_deeply_nested_json_is_a_parse_error(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        client.send_body(b"[" * 100_000)
        assert_error(client.recv(), -32700, "parse_error")
        client.ping()


def test_rpc_discover_is_an_openrpc_document(daemon: DaemonProcess, framing: Framing) -> None:
    with daemon.connect(framing) as client:
        reply = client.call("rpc.discover")
        doc = reply["result"]
        check_openrpc_document(doc)
        status = client.call("daemon.status")["result"]
        assert doc["info"]["version"] == status["version"]


# ---- limits ------------------------------------------------------------------------


def test_a_frame_under_the_limit_is_served(
    small_frames_daemon: DaemonProcess, framing: Framing
) -> None:
    with small_frames_daemon.connect(framing) as client:
        pad = "x" * (SMALL_MAX_FRAME_BYTES - 200)
        error = assert_error(client.call("daemon.ping", {"pad": pad}), -32602, "invalid_params")
        assert "pad" in error["message"]
        client.ping()


def test_an_oversize_frame_is_refused_and_the_connection_closed(
    small_frames_daemon: DaemonProcess, framing: Framing
) -> None:
    with small_frames_daemon.connect(framing) as client:
        client.ping()
        pad = "x" * (SMALL_MAX_FRAME_BYTES + 1)
        client.send({"jsonrpc": "2.0", "id": 2, "method": "daemon.ping", "params": {"pad": pad}})
        frames = client.recv_until_closed()
        assert len(frames) == 1, frames
        reply = msgspec.json.decode(frames[0])
        error = assert_error(reply, -32000, "frame_too_large")
        assert error["data"]["maxFrameBytes"] == SMALL_MAX_FRAME_BYTES
        assert reply["id"] is None
    small_frames_daemon.ping()


def test_an_oversize_content_length_is_refused_before_the_body(
    small_frames_daemon: DaemonProcess,
) -> None:
    with small_frames_daemon.connect(Framing.CONTENT_LENGTH) as client:
        client.send_raw(b"Content-Length: %d\r\n\r\n" % (SMALL_MAX_FRAME_BYTES + 1))
        frames = client.recv_until_closed()
        assert len(frames) == 1, frames
        assert_error(msgspec.json.decode(frames[0]), -32000, "frame_too_large")


def test_a_framing_error_gets_one_reply_then_the_connection_closes(daemon: DaemonProcess) -> None:
    with daemon.connect(Framing.CONTENT_LENGTH) as client:
        client.send_raw(b"Content-Length: 2\r\nX-Unknown: 1\r\n\r\n{}")
        frames = client.recv_until_closed()
        assert len(frames) == 1, frames
        assert_error(msgspec.json.decode(frames[0]), -32700, "parse_error")
    daemon.ping()


GARBAGE = {
    # No framing can start like this: refused at once.
    "random": (b"\xff", Framing.NDJSON),
    # NDJSON is chosen, then ~4k lines of garbage, each a parse error.
    "ndjson-then-random": (b"{", Framing.NDJSON),
    # One 16-byte body of garbage, then a header block of garbage.
    "content-length-then-random": (b"Content-Length: 16\r\n\r\n", Framing.CONTENT_LENGTH),
}


@pytest.mark.parametrize(("prefix", "framing"), list(GARBAGE.values()), ids=list(GARBAGE))
def test_a_mebibyte_of_garbage_affects_only_its_own_connection(
    daemon: DaemonProcess, prefix: bytes, framing: Framing
) -> None:
    garbage = prefix + random.Random(1234).randbytes(1 << 20)
    with daemon.connect() as bystander, WireClient(daemon.socket, framing) as victim:
        bystander.ping()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            victim.send_raw(garbage)
        with contextlib.suppress(OSError):
            victim.sock.shutdown(socket.SHUT_WR)
        # Every reply is an error with a null id (a garbage line may happen to be a
        # JSON scalar: invalid request). NDJSON garbage may also be cut off when the
        # client does not read its replies fast enough.
        frames = victim.recv_until_closed()
        assert frames or framing is Framing.NDJSON
        for frame in frames:
            reply = msgspec.json.decode(frame)
            assert reply["id"] is None
            assert reply["error"]["code"] in (-32700, -32600), reply
            assert_error(reply, reply["error"]["code"])
        bystander.ping()
    daemon.ping()


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
def test_clients_that_leave_without_reading_do_not_hurt_the_daemon(
    daemon: DaemonProcess, reset: bool
) -> None:
    # The daemon's writes then fail with EPIPE or ECONNRESET; that must end only the
    # connection (a nursery wraps those errors in an ExceptionGroup).
    discover = enc({"jsonrpc": "2.0", "id": 1, "method": "rpc.discover"}) + b"\n"
    with daemon.connect() as bystander:
        for _ in range(50):
            with WireClient(daemon.socket) as leaver:
                leaver.send_raw(discover * 20)
                if reset:
                    leaver.sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
        # Wait until the daemon has finished with every leaver: only the bystander is left.
        deadline = time.monotonic() + IO_TIMEOUT_S
        while bystander.call("daemon.status")["result"]["connections"] != 1:
            assert time.monotonic() < deadline, "the leavers' connections never ended"
            time.sleep(POLL_S)
        bystander.ping()
    daemon.ping()
