"""The synchronous client: framing, ids, notifications and errors against a scripted
fake daemon; then the typed methods against a real ``agentsd``."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentsctl import Client
from agentsctl.client import Notification
from agentsctl.daemon import (
    MAX_REPLY_BYTES,
    DaemonDisconnected,
    DaemonNotRunning,
    DaemonUnreachable,
    Link,
    default_socket_path,
    default_state_dir,
    quick_call,
)
from agentsd_protocol import methods, paths
from agentsd_protocol.api import daemon as d
from agentsd_protocol.api import session as s
from agentsd_protocol.errors import (
    InvalidParams,
    MethodNotFound,
    ParseError,
    RpcError,
    SessionNotFound,
    StaleFence,
)
from agentsd_protocol.framing import DEFAULT_MAX_FRAME_BYTES
from tests.clients.conftest import FakeDaemon, Peer
from tests.daemon_process import DaemonProcess

# -- requests and replies ---------------------------------------------------------


def test_call_sends_jsonrpc_with_fresh_integer_ids(fake_daemon: FakeDaemon) -> None:
    seen: list[dict[str, Any]] = []

    def script(peer: Peer) -> None:
        for _ in range(2):
            request = peer.recv()
            seen.append(request)
            peer.reply(request, {"pong": True})

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        assert client.call(methods.PING) == d.PingResult(pong=True)
        assert client.call("daemon.ping", {"x": 1}) == {"pong": True}
    assert seen[0] == {"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"}
    assert seen[1] == {"jsonrpc": "2.0", "id": 2, "method": "daemon.ping", "params": {"x": 1}}


def test_struct_params_go_out_in_wire_names(fake_daemon: FakeDaemon) -> None:
    seen: list[dict[str, Any]] = []

    def script(peer: Peer) -> None:
        request = peer.recv()
        seen.append(request)
        peer.reply(request, {"sessionId": "s-1", "deleted": True})

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        params = s.DeleteParams(session_id="s-1", client_operation_id="op-1", expected_fence=4)
        result = client.call(methods.DELETE, params)
    assert result == s.DeleteResult(session_id="s-1", deleted=True)
    assert seen[0]["method"] == "agentSession.delete"
    assert seen[0]["params"] == {
        "sessionId": "s-1",
        "clientOperationId": "op-1",
        "expectedFence": 4,
    }


def test_replies_out_of_order_are_matched_by_id(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        first, second = peer.recv(), peer.recv()
        peer.reply(second, "second")
        peer.reply(first, "first")

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        first = client.submit("test.first")
        second = client.submit("test.second")
        assert client.wait(first) == "first"  # reads, and keeps, the reply to second
        assert client.wait(second) == "second"
        with pytest.raises(ValueError, match="not pending"):
            client.wait(second)


def test_a_late_reply_to_a_timed_out_call_is_dropped(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        slow = peer.recv()
        fast = peer.recv()  # sent only once the client gave up on the first call
        peer.reply(slow, "too late")
        peer.reply(fast, "fast")

    fake_daemon.serve(script)
    with Client(fake_daemon.path, timeout_s=0.2) as client:
        with pytest.raises(TimeoutError, match=r"did not answer test\.slow"):
            client.call("test.slow")
        assert client.call("test.fast") == "fast"


def test_batch_replies_are_split(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        a, b = peer.recv(), peer.recv()
        peer.send(
            [
                {"jsonrpc": "2.0", "id": b["id"], "result": 2},
                {"jsonrpc": "2.0", "id": a["id"], "result": 1},
            ]
        )

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        a, b = client.submit("test.a"), client.submit("test.b")
        assert (client.wait(a), client.wait(b)) == (1, 2)


def test_a_result_that_does_not_fit_its_type_is_a_parse_error(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        peer.reply(peer.recv(), {"pong": "not a bool"})

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client, pytest.raises(ParseError, match="pong"):
        client.call(methods.PING)


# -- notifications ----------------------------------------------------------------


def test_notifications_interleaved_with_replies_are_kept_in_order(
    fake_daemon: FakeDaemon,
) -> None:
    def script(peer: Peer) -> None:
        request = peer.recv()
        peer.notify("agentSession.delta", {"n": 1})
        peer.notify("agentSession.delta", {"n": 2})
        peer.reply(request, {"pong": True})
        peer.notify("agentSession.delta", {"n": 3})
        # A reply and a notification in one segment, then a clean close.
        second = peer.recv()
        peer.send_raw(
            b'{"jsonrpc":"2.0","method":"agentSession.status","params":{"n":4}}\n'
            + b'{"jsonrpc":"2.0","id":%d,"result":null}\n' % second["id"]
        )

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        client.call(methods.PING)
        first = client.next_notification(timeout_s=5)
        assert isinstance(first, Notification)
        assert first.method == "agentSession.delta"
        assert first.decode(dict[str, int]) == {"n": 1}
        assert client.call("test.second") is None
        rest = [(n.method, n.decode(dict[str, int])["n"]) for n in client.notifications()]
    assert rest == [
        ("agentSession.delta", 2),
        ("agentSession.delta", 3),
        ("agentSession.status", 4),
    ]


def test_next_notification_times_out_with_none(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        peer.wait_closed()

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        assert client.next_notification(timeout_s=0.05) is None


def test_a_request_from_the_daemon_is_refused_with_method_not_found(
    fake_daemon: FakeDaemon,
) -> None:
    answers: list[dict[str, Any]] = []

    def script(peer: Peer) -> None:
        request = peer.recv()
        peer.send({"jsonrpc": "2.0", "id": "srv-1", "method": "client.doSomething", "params": {}})
        answers.append(peer.recv())
        peer.reply(request, "ok")

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        assert client.call("test.x") == "ok"
    assert answers[0]["id"] == "srv-1"
    assert answers[0]["error"]["code"] == MethodNotFound.code


# -- errors -----------------------------------------------------------------------


def test_an_error_reply_raises_the_class_the_daemon_raised(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        for error in (SessionNotFound("no session s-9"), StaleFence("stale", currentFence=7)):
            request = peer.recv()
            wire = error.to_wire()
            peer.send(
                {
                    "jsonrpc": "2.0",
                    "id": request["id"],
                    "error": {"code": wire.code, "message": wire.message, "data": wire.data},
                }
            )

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        with pytest.raises(SessionNotFound) as not_found:
            client.call(methods.GET, s.GetParams(session_id="s-9"))
        assert (not_found.value.kind, not_found.value.message) == (
            "session_not_found",
            "no session s-9",
        )
        with pytest.raises(StaleFence) as stale:
            client.call(methods.START, s.StartParams(session_id="s-9", expected_fence=3))
        assert stale.value.kind == "stale_fence"
        assert stale.value.details == {"currentFence": 7}


def test_an_unknown_error_code_keeps_its_code_and_kind(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        request = peer.recv()
        error = {"code": -32099, "message": "from the future", "data": {"kind": "future_kind"}}
        peer.send({"jsonrpc": "2.0", "id": request["id"], "error": error})

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client, pytest.raises(RpcError) as caught:
        client.call("test.x")
    assert type(caught.value) is RpcError
    assert (caught.value.code, caught.value.kind) == (-32099, "future_kind")


def test_an_error_with_a_null_id_fails_the_waiting_call(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        peer.recv()
        error = ParseError("Parse error: garbage").to_wire()
        peer.send({"jsonrpc": "2.0", "id": None, "error": msgspec.to_builtins(error)})

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client, pytest.raises(ParseError, match="garbage"):
        client.call("test.x")


def test_a_daemon_closing_mid_reply_raises_disconnected_for_good(
    fake_daemon: FakeDaemon,
) -> None:
    def script(peer: Peer) -> None:
        request = peer.recv()
        peer.send_raw(b'{"jsonrpc":"2.0","id":%d,"res' % request["id"])

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        with pytest.raises(DaemonDisconnected) as caught:
            client.call(methods.STATUS)
        assert str(fake_daemon.path) in str(caught.value)
        assert "closed the connection with requests unanswered" in str(caught.value)
        assert client.closed
        with pytest.raises(DaemonDisconnected, match="is closed"):
            client.call(methods.PING)


def test_garbage_from_the_daemon_is_a_parse_error_and_closes(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        peer.recv()
        peer.send_raw(b"this is not json\n")
        peer.wait_closed()

    fake_daemon.serve(script)
    with Client(fake_daemon.path) as client:
        with pytest.raises(ParseError):
            client.call(methods.PING)
        assert client.closed


def test_no_socket_raises_daemon_unreachable_naming_the_path(temp_dir: Path) -> None:
    missing = temp_dir / "nobody.sock"
    with pytest.raises(DaemonNotRunning) as caught:
        Client(missing)
    assert isinstance(caught.value, DaemonUnreachable)
    assert caught.value.socket_path == str(missing)
    assert str(missing) in str(caught.value)


def test_a_socket_nobody_listens_on_raises_daemon_unreachable(temp_dir: Path) -> None:
    stale = temp_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(stale))  # bound, never listening: connect is refused
        with pytest.raises(DaemonNotRunning, match=re.escape(str(stale))):
            Client(stale)


def test_a_socket_path_too_long_raises_daemon_unreachable(temp_dir: Path) -> None:
    too_long = temp_dir / ("x" * 120)
    with pytest.raises(DaemonUnreachable, match="cannot reach agentsd"):
        Client(too_long)


# -- the stdlib link the CLI uses -------------------------------------------------


def test_link_skips_notifications_and_maps_errors(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        request = peer.recv()
        peer.notify("agentSession.delta", {"n": 1})
        peer.reply(request, {"pong": True})
        request = peer.recv()
        wire = SessionNotFound("gone").to_wire()
        peer.send({"jsonrpc": "2.0", "id": request["id"], "error": msgspec.to_builtins(wire)})
        request = peer.recv()
        peer.send_raw(b"{broken\n")

    fake_daemon.serve(script)
    with Link(fake_daemon.path) as link:
        assert link.call("daemon.ping") == {"pong": True}
        with pytest.raises(SessionNotFound, match="gone"):
            link.call("agentSession.get", {"sessionId": "x"})
        with pytest.raises(ParseError):
            link.call("daemon.ping")


def test_link_takes_an_error_with_a_null_id_as_its_own(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        peer.recv()
        error = msgspec.to_builtins(ParseError("Parse error: garbage").to_wire())
        peer.send({"jsonrpc": "2.0", "id": 999, "result": "not ours"})
        peer.send({"jsonrpc": "2.0", "id": None, "error": error})

    fake_daemon.serve(script)
    with pytest.raises(ParseError, match="garbage"):
        quick_call(fake_daemon.path, "daemon.ping")


def test_link_raises_disconnected_when_the_daemon_closes(fake_daemon: FakeDaemon) -> None:
    def script(peer: Peer) -> None:
        peer.recv()

    fake_daemon.serve(script)
    with pytest.raises(DaemonDisconnected, match=r"before answering daemon\.status"):
        quick_call(fake_daemon.path, "daemon.status")


def test_stdlib_limits_and_paths_agree_with_the_protocol_package() -> None:
    assert MAX_REPLY_BYTES == DEFAULT_MAX_FRAME_BYTES
    envs: list[dict[str, str]] = [
        {"HOME": "/home/u"},
        {"HOME": "/home/u", "XDG_STATE_HOME": "/xs"},
        {"HOME": "/home/u", "XDG_RUNTIME_DIR": "/run/user/1"},
        {"HOME": "/home/u", "AGENTSD_STATE_DIR": "/st", "XDG_STATE_HOME": "/xs"},
        {"HOME": "/home/u", "AGENTSD_SOCKET": "/s/a.sock", "XDG_RUNTIME_DIR": "/r"},
    ]
    for env in envs:
        assert Path(default_state_dir(env)) == paths.default_state_dir(env), env
        assert Path(default_socket_path(env)) == paths.default_socket_path(env), env
        assert Path(default_socket_path(env, "/sd")) == paths.default_socket_path(
            env, Path("/sd")
        ), env


# -- against a real daemon --------------------------------------------------------


def test_typed_daemon_methods(daemon: DaemonProcess) -> None:
    with Client(daemon.socket) as client:
        assert client.call(methods.PING).pong is True
        status = client.call(methods.STATUS)
        assert status.pid == daemon.process.pid
        assert Path(status.socket) == daemon.socket
        assert status.connections >= 1
        document = client.call(methods.DISCOVER)
        names = {method["name"] for method in document["methods"]}
        assert {"daemon.ping", "daemon.status", "agentSession.create"} <= names
        with pytest.raises(MethodNotFound):
            client.call("no.suchMethod")
        with pytest.raises(InvalidParams):
            client.call("daemon.ping", {"unexpected": 1})
        assert client.call(methods.SHUTDOWN).stopping is True
    assert daemon.wait() == 0


def test_default_socket_path_comes_from_the_environment(
    daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTSD_SOCKET", os.fspath(daemon.socket))
    with Client() as client:
        assert client.socket_path == daemon.socket
        assert client.call(methods.PING).pong is True
