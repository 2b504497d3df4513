"""The sans-IO client core: ids, replies matched in any order, errors rebuilt,
notifications routed, and nothing but protocol errors from bad bytes."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsd_protocol import methods
from agentsd_protocol.api import daemon as d
from agentsd_protocol.api import session as s
from agentsd_protocol.api import stream as sm
from agentsd_protocol.client.core import (
    ClientCore,
    IncomingRequest,
    Notification,
    PendingCall,
    Routed,
)
from agentsd_protocol.errors import (
    ErrorObject,
    FrameTooLarge,
    MethodNotFound,
    ParseError,
    RpcError,
    SessionNotFound,
    StaleFence,
)

SETTINGS = settings(max_examples=150, deadline=None)


def line(message: Any) -> bytes:
    return json.dumps(message).encode() + b"\n"


def reply(request_id: Any, result: Any) -> bytes:
    return line({"jsonrpc": "2.0", "id": request_id, "result": result})


def error_reply(request_id: Any, error: RpcError) -> bytes:
    wire = msgspec.to_builtins(error.to_wire())
    return line({"jsonrpc": "2.0", "id": request_id, "error": wire})


def notification(method: str, params: Any) -> bytes:
    return line({"jsonrpc": "2.0", "method": method, "params": params})


def test_requests_carry_fresh_integer_ids_and_wire_names() -> None:
    core: ClientCore[object] = ClientCore()
    ping, ping_bytes = core.request(methods.PING)
    delete, delete_bytes = core.request(
        methods.DELETE,
        s.DeleteParams(session_id="s-1", client_operation_id="op-1", expected_fence=4),
    )
    assert json.loads(ping_bytes) == {"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"}
    assert json.loads(delete_bytes) == {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "agentSession.delete",
        "params": {"sessionId": "s-1", "clientOperationId": "op-1", "expectedFence": 4},
    }
    assert delete_bytes.endswith(b"\n") and (ping.id, delete.id) == (1, 2)
    assert core.pending == 2


def test_a_reply_settles_its_call_with_the_typed_result() -> None:
    core: ClientCore[object] = ClientCore()
    call, _ = core.request(methods.PING)
    with pytest.raises(RuntimeError, match="no reply yet"):
        call.result()
    assert core.receive_data(reply(call.id, {"pong": True})) == [call]
    assert call.done and call.result() == d.PingResult(pong=True)
    assert core.pending == 0


def test_an_untyped_call_gets_plain_json() -> None:
    core: ClientCore[object] = ClientCore()
    call, _ = core.request(methods.untyped("test.x"), {"a": 1})
    core.receive_data(reply(call.id, {"b": [1, 2]}))
    assert call.result() == {"b": [1, 2]}


def test_error_replies_rebuild_the_daemons_class() -> None:
    core: ClientCore[object] = ClientCore()
    get, _ = core.request(methods.GET, s.GetParams(session_id="s-9"))
    start, _ = core.request(methods.START, s.StartParams(session_id="s-9"))
    core.receive_data(
        error_reply(get.id, SessionNotFound("no session s-9"))
        + error_reply(start.id, StaleFence("stale", currentFence=7))
    )
    with pytest.raises(SessionNotFound, match="no session s-9"):
        get.result()
    with pytest.raises(StaleFence) as stale:
        start.result()
    assert stale.value.details == {"currentFence": 7}


def test_a_result_that_does_not_fit_fails_that_call_alone() -> None:
    core: ClientCore[object] = ClientCore()
    bad, _ = core.request(methods.PING)
    good, _ = core.request(methods.PING)
    core.receive_data(reply(bad.id, {"pong": "no"}) + reply(good.id, {"pong": True}))
    with pytest.raises(ParseError, match=r"daemon\.ping .*pong"):
        bad.result()
    assert good.result().pong


def test_a_forgotten_call_drops_its_late_reply() -> None:
    core: ClientCore[object] = ClientCore()
    call, _ = core.request(methods.PING)
    core.forget(call)
    assert core.receive_data(reply(call.id, {"pong": True}) + reply(999, "nobody's")) == []
    assert not call.done


def test_an_error_with_a_null_id_breaks_the_connection_with_that_error() -> None:
    core: ClientCore[object] = ClientCore()
    core.request(methods.PING)
    with pytest.raises(ParseError, match="garbage"):
        core.receive_data(error_reply(None, ParseError("Parse error: garbage")))


def test_a_request_from_the_other_end_is_an_event_and_can_be_refused() -> None:
    core: ClientCore[object] = ClientCore()
    (event,) = core.receive_data(
        line({"jsonrpc": "2.0", "id": "srv-1", "method": "client.do", "params": {}})
    )
    assert isinstance(event, IncomingRequest)
    assert (event.id, event.method) == ("srv-1", "client.do")
    refusal = json.loads(core.refuse(event))
    assert refusal["id"] == "srv-1"
    assert refusal["error"]["code"] == MethodNotFound.code


def test_a_streaming_reply_routes_the_notifications_after_it() -> None:
    core: ClientCore[str] = ClientCore()
    call, _ = core.request(
        methods.SUBSCRIBE, sm.SubscribeParams(session_id="s", after_seq=0), route="mine"
    )
    delta = {"subscriptionId": "sub-1", "sessionId": "s", "itemId": "i", "offset": 0}
    delta |= {"text": "x", "afterSeq": 0}
    events = core.receive_data(
        notification("agentSession.delta", delta)  # before the reply: not routed yet
        + reply(call.id, {"subscriptionId": "sub-1", "headSeq": 0})
        + notification("agentSession.delta", delta)
        + notification("agentSession.status", {"watchId": "w-1"})
    )
    assert [type(e) for e in events] == [Notification, PendingCall, Routed, Notification]
    routed = events[2]
    assert isinstance(routed, Routed) and routed.route == "mine"
    assert routed.notification.decode(sm.DeltaNotification).text == "x"
    core.drop_route("sub-1", "mine")
    assert isinstance(core.receive_data(notification("agentSession.delta", delta))[0], Notification)


def test_only_a_streaming_method_takes_a_route() -> None:
    core: ClientCore[str] = ClientCore()
    with pytest.raises(ValueError, match="not a streaming method"):
        core.request(methods.PING, route="mine")


def test_fail_settles_every_pending_call_and_returns_the_routes() -> None:
    core: ClientCore[str] = ClientCore()
    subscribe, _ = core.request(methods.SUBSCRIBE, sm.SubscribeParams(session_id="s"), route="r")
    core.receive_data(reply(subscribe.id, {"subscriptionId": "sub-1", "headSeq": 0}))
    ping, _ = core.request(methods.PING)
    assert core.fail(ConnectionError("gone")) == ["r"]
    with pytest.raises(ConnectionError, match="gone"):
        ping.result()
    assert core.pending == 0


def test_every_method_is_registered_once_with_its_flags() -> None:
    assert len(methods.METHODS) == 28
    assert methods.QUEUE.mutation and methods.SET_TITLE.mutation
    assert methods.METHODS["agentSession.send"] is methods.SEND
    assert methods.METHODS["daemon.reloadEnv"].mutation
    assert {
        "daemon.ping",
        "daemon.status",
        "rpc.discover",
        "agentSession.get",
        "agentSession.list",
    } == methods.INLINE_METHODS
    streaming = {name for name, m in methods.METHODS.items() if m.stream_key is not None}
    assert streaming == {
        "agentSession.subscribe",
        "agentSession.watch",
        "agentSession.completions",
    }
    assert not any(m.mutation and m.inline for m in methods.METHODS.values())


# -- properties --------------------------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> tuple[int, list[tuple[str, int]], list[int]]:
    """n requests; the daemon's messages (replies in any order, notifications between
    them); and the cut points that chunk the byte stream."""
    n = draw(st.integers(min_value=1, max_value=12))
    replies = draw(st.permutations(range(1, n + 1)))
    notes = draw(st.lists(st.integers(min_value=0, max_value=1000), max_size=12))
    messages = [("reply", request_id) for request_id in replies]
    for note in notes:
        at = draw(st.integers(min_value=0, max_value=len(messages)))
        messages.insert(at, ("note", note))
    cuts = draw(st.lists(st.integers(min_value=0, max_value=4096), max_size=8))
    return n, messages, cuts


@SETTINGS
@given(conversations())
def test_any_interleaving_of_replies_and_notifications_is_matched(
    conversation: tuple[int, list[tuple[str, int]], list[int]],
) -> None:
    n, messages, cuts = conversation
    core: ClientCore[object] = ClientCore()
    calls = [core.request(methods.untyped(f"test.m{i}"))[0] for i in range(1, n + 1)]
    wire = b"".join(
        reply(value, {"for": value}) if kind == "reply" else notification("x.note", {"n": value})
        for kind, value in messages
    )
    chunks, start = [], 0
    for cut in sorted(min(cut, len(wire)) for cut in cuts):
        chunks.append(wire[start:cut])
        start = cut
    chunks.append(wire[start:])
    events = [event for chunk in chunks for event in core.receive_data(chunk)]
    for call in calls:
        assert call.result() == {"for": call.id}
    notes = [e.decode(dict[str, int])["n"] for e in events if isinstance(e, Notification)]
    assert notes == [value for kind, value in messages if kind == "note"]
    settled = [e.id for e in events if isinstance(e, PendingCall)]
    assert settled == [value for kind, value in messages if kind == "reply"]


@SETTINGS
@given(st.lists(st.binary(max_size=200), max_size=8))
def test_arbitrary_bytes_raise_only_protocol_errors(chunks: list[bytes]) -> None:
    core: ClientCore[str] = ClientCore(max_frame_bytes=512)
    core.request(methods.SUBSCRIBE, sm.SubscribeParams(session_id="s"), route="r")
    core.request(methods.PING)
    with contextlib.suppress(ParseError, FrameTooLarge):
        for chunk in chunks:
            core.receive_data(chunk)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)


@SETTINGS
@given(
    st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "jsonrpc": st.just("2.0") | json_values,
                "id": st.integers(min_value=-1, max_value=3) | st.none() | json_values,
                "method": st.sampled_from(["agentSession.event", "x"]) | json_values,
                "params": json_values,
                "result": json_values,
                "error": json_values
                | st.fixed_dictionaries(
                    {"code": st.integers(-32700, -32000), "message": st.text(max_size=8)},
                    optional={"data": json_values},
                ),
            },
        ),
        min_size=1,
        max_size=4,
    )
)
def test_well_formed_json_that_is_not_jsonrpc_raises_only_rpc_errors(
    messages: list[dict[str, Any]],
) -> None:
    core: ClientCore[str] = ClientCore()
    core.request(methods.SUBSCRIBE, sm.SubscribeParams(session_id="s"), route="r")
    core.request(methods.PING)
    wire = b"".join(line(message) for message in messages)
    with contextlib.suppress(RpcError):
        core.receive_data(wire)


def test_a_peer_of_another_protocol_brings_its_own_errors() -> None:
    class Foreign(Exception):
        def __init__(self, error: ErrorObject) -> None:
            super().__init__(error.message)
            self.code = error.code

    core: ClientCore[object] = ClientCore(rebuild_error=Foreign)
    call, _ = core.request(methods.untyped("ask"), {"n": 1})
    core.receive_data(
        line({"jsonrpc": "2.0", "id": call.id, "error": {"code": -1, "message": "no"}})
    )
    with pytest.raises(Foreign) as caught:
        call.result()
    assert caught.value.code == -1
