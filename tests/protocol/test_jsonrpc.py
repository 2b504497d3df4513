"""JSON-RPC 2.0 rules at the unit level: envelopes, ids, notifications, batches and the
two-step params decoding; plus a round-trip of every registered wire type."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UnsetType
from msgspec import inspect as mi

from agentsd_protocol.api.session import CreateParams, GetParams
from agentsd_protocol.errors import (
    ErrorObject,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    ParseError,
)
from agentsd_protocol.jsonrpc import (
    NO_PARAMS,
    ClientIncoming,
    DecodedFrame,
    InvalidEntry,
    RequestEnvelope,
    decode_client_frame,
    decode_entry,
    decode_frame,
    decode_params,
    encode_batch,
    encode_error,
    encode_notification,
    encode_request,
    encode_success,
    is_batch,
)
from agentsd_protocol.methods import METHODS

SETTINGS = settings(max_examples=150, deadline=None)


def enc(value: Any) -> bytes:
    return msgspec.json.encode(value)


def one(frame: bytes) -> RequestEnvelope | InvalidEntry:
    decoded = decode_frame(frame)
    assert not decoded.is_batch
    assert len(decoded.entries) == 1
    return decoded.entries[0]


def envelope(frame: Any) -> RequestEnvelope:
    entry = one(enc(frame))
    assert isinstance(entry, RequestEnvelope), entry
    return entry


def invalid(frame: bytes) -> InvalidEntry:
    entry = one(frame)
    assert isinstance(entry, InvalidEntry), entry
    return entry


# ---- envelopes and ids --------------------------------------------------------------


@pytest.mark.parametrize("request_id", [0, 1, -7, 2**53, "", "abc", "é"])
def test_ids_are_ints_or_strings(request_id: int | str) -> None:
    env = envelope({"jsonrpc": "2.0", "id": request_id, "method": "daemon.ping"})
    assert env.id == request_id
    assert type(env.id) is type(request_id)
    assert not env.is_notification


def test_a_null_id_is_a_request_not_a_notification() -> None:
    env = envelope({"jsonrpc": "2.0", "id": None, "method": "daemon.ping"})
    assert env.id is None
    assert not env.is_notification


def test_a_missing_id_is_a_notification() -> None:
    env = envelope({"jsonrpc": "2.0", "method": "daemon.ping"})
    assert env.is_notification


@pytest.mark.parametrize("bad_id", [True, False, 1.5, [1], {"a": 1}])
def test_other_ids_are_invalid_requests(bad_id: Any) -> None:
    entry = invalid(enc({"jsonrpc": "2.0", "id": bad_id, "method": "daemon.ping"}))
    assert isinstance(entry.error, InvalidRequest)
    assert entry.id is None  # an unusable id is never echoed back
    assert "$.id" in entry.error.message


def test_params_default_to_an_empty_object() -> None:
    env = envelope({"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"})
    assert bytes(env.params) == b"{}"


@pytest.mark.parametrize(
    ("message", "salvaged_id"),
    [
        pytest.param({"id": 4, "method": "daemon.ping"}, 4, id="no-jsonrpc"),
        pytest.param({"jsonrpc": "1.0", "id": 4, "method": "daemon.ping"}, 4, id="wrong-version"),
        pytest.param({"jsonrpc": "2.0", "id": "x", "method": 1}, "x", id="method-not-string"),
        pytest.param({"jsonrpc": "2.0", "id": 4}, 4, id="no-method"),
        pytest.param(
            {"jsonrpc": "2.0", "id": 4, "method": "m", "params": "str"}, 4, id="params-string"
        ),
        pytest.param({"jsonrpc": "2.0", "id": 4, "method": "m", "params": 3}, 4, id="params-int"),
        pytest.param(
            {"jsonrpc": "2.0", "id": 4, "method": "m", "params": None}, 4, id="params-null"
        ),
        pytest.param({"jsonrpc": "2.0", "id": 4, "method": "m", "extra": 1}, 4, id="extra-member"),
        pytest.param({"jsonrpc": "2.0", "id": True, "method": "m"}, None, id="bool-id"),
        pytest.param(1, None, id="number"),
        pytest.param("x", None, id="string"),
        pytest.param(None, None, id="null"),
    ],
)
def test_invalid_requests_keep_a_usable_id(message: Any, salvaged_id: int | str | None) -> None:
    entry = invalid(enc(message))
    assert isinstance(entry.error, InvalidRequest)
    assert entry.error.code == -32600
    assert entry.id == salvaged_id


@pytest.mark.parametrize(
    "frame",
    [b"{", b"not json", b'{"jsonrpc":"2.0"} trailing', b"\xff\xfe", b"", b"[1,", b"[" * 100_000],
)
def test_unparsable_frames_are_parse_errors_with_a_null_id(frame: bytes) -> None:
    entry = invalid(frame)
    assert isinstance(entry.error, ParseError)
    assert entry.error.code == -32700
    assert entry.id is None


def test_deeply_nested_params_are_a_parse_error_not_a_crash() -> None:
    frame = b'{"jsonrpc":"2.0","id":1,"method":"m","params":' + b"[" * 100_000
    assert isinstance(invalid(frame).error, ParseError)


# ---- batches -----------------------------------------------------------------------


def test_an_empty_batch_is_one_invalid_request_not_an_array() -> None:
    decoded = decode_frame(b" [ ] ")
    assert not decoded.is_batch
    [entry] = decoded.entries
    assert isinstance(entry, InvalidEntry)
    assert isinstance(entry.error, InvalidRequest)
    assert entry.id is None


def test_a_batch_of_notifications_yields_only_notifications() -> None:
    batch = [{"jsonrpc": "2.0", "method": "daemon.ping"} for _ in range(3)]
    decoded = decode_frame(enc(batch))
    assert decoded.is_batch
    assert all(isinstance(e, RequestEnvelope) and e.is_notification for e in decoded.entries)
    assert replies_for(decoded) is None


def test_a_mixed_batch_keeps_order_and_flags_each_invalid_member() -> None:
    batch: list[Any] = [
        {"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"},
        {"jsonrpc": "2.0", "method": "daemon.ping"},
        1,
        {"jsonrpc": "2.0", "id": "x", "method": 5},
        {"foo": "bar"},
        {"jsonrpc": "2.0", "id": 2, "method": "daemon.status", "params": {}},
    ]
    decoded = decode_frame(enc(batch))
    assert decoded.is_batch
    kinds = [
        type(e.error).__name__ if isinstance(e, InvalidEntry) else e.method for e in decoded.entries
    ]
    assert kinds == [
        "daemon.ping",
        "daemon.ping",
        "InvalidRequest",
        "InvalidRequest",
        "InvalidRequest",
        "daemon.status",
    ]
    assert [e.id for e in decoded.entries if isinstance(e, InvalidEntry)] == [None, "x", None]
    reply = replies_for(decoded)
    assert isinstance(reply, list)
    assert len(reply) == 5  # every member but the notification


def test_the_spec_example_batch_of_numbers_is_three_invalid_requests() -> None:
    decoded = decode_frame(b"[1,2,3]")
    assert decoded.is_batch
    assert [type(e.error) for e in decoded.entries if isinstance(e, InvalidEntry)] == [
        InvalidRequest
    ] * 3


def test_an_unparsable_batch_is_one_parse_error() -> None:
    decoded = decode_frame(b'[{"jsonrpc": "2.0", "method": "sum"},{"jsonrpc": "2.0", "method"]')
    assert not decoded.is_batch
    [entry] = decoded.entries
    assert isinstance(entry, InvalidEntry)
    assert isinstance(entry.error, ParseError)


def replies_for(decoded: DecodedFrame) -> Any:
    """What the spec says must be sent back for ``decoded`` if every request
    succeeded: None for nothing, a list for a batch, else one object."""
    replies = []
    for e in decoded.entries:
        if isinstance(e, InvalidEntry):
            replies.append(msgspec.json.decode(encode_error(e.id, e.error)))
        elif not isinstance(e.id, UnsetType):  # a notification gets nothing
            replies.append(msgspec.json.decode(encode_success(e.id, 1)))
    if not replies:
        return None
    if decoded.is_batch:
        return msgspec.json.decode(encode_batch([enc(r) for r in replies]))
    return replies[0]


# ---- decode_frame never raises ------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
envelope_like = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]) | json_values,
        "id": st.integers() | st.text(max_size=5) | json_values,
        "method": st.sampled_from(list(METHODS)) | json_values,
        "params": st.dictionaries(st.text(max_size=5), json_values, max_size=3) | json_values,
    },
)
frames = (
    st.binary(max_size=200)
    | json_values.map(enc)
    | envelope_like.map(enc)
    | st.lists(envelope_like | json_values, max_size=5).map(enc)
)


@SETTINGS
@given(frame=frames)
def test_decode_frame_never_raises_and_errors_carry_no_traceback(frame: bytes) -> None:
    decoded = decode_frame(frame)
    assert decoded.entries
    for entry in decoded.entries:
        if isinstance(entry, InvalidEntry):
            assert isinstance(entry.error, ParseError | InvalidRequest)
            assert entry.id is None or isinstance(entry.id, int | str)
            assert not isinstance(entry.id, bool)
            wire = msgspec.json.decode(encode_error(entry.id, entry.error))
            assert "Traceback" not in wire["error"]["message"]
        else:
            assert isinstance(entry.method, str)
            assert bytes(entry.params)[:1] in (b"{", b"[")


@SETTINGS
@given(
    request_id=st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(max_size=10),
    method=st.text(max_size=20),
    params=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
)
def test_encode_request_decodes_back(request_id: int | str, method: str, params: Any) -> None:
    env = envelope(msgspec.json.decode(encode_request(method, params, request_id)))
    assert (env.id, env.method) == (request_id, method)
    assert msgspec.json.decode(env.params) == params
    note = envelope(msgspec.json.decode(encode_request(method, params, None)))
    assert note.is_notification


# ---- params: the second decoding step -----------------------------------------------


def test_params_as_an_array_are_invalid_params() -> None:
    env = envelope({"jsonrpc": "2.0", "id": 1, "method": "agentSession.get", "params": ["s"]})
    with pytest.raises(InvalidParams) as info:
        decode_params(env, GetParams)
    assert info.value.code == -32602


def test_unknown_fields_in_params_are_named() -> None:
    env = envelope(
        {"jsonrpc": "2.0", "id": 1, "method": "daemon.ping", "params": {"bogusField": 1}}
    )
    with pytest.raises(InvalidParams) as info:
        decode_params(env, METHODS["daemon.ping"].params)
    assert "bogusField" in info.value.message


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({"provider": "mock", "cwd": "/", "env": {"A": 1}}, "$.env[...]"),
        ({"provider": "mock", "cwd": "/", "command": ["a", 1]}, "$.command[1]"),
        ({"provider": "mock", "cwd": "/", "clientOperationId": 5}, "$.clientOperationId"),
        ({"provider": 1, "cwd": "/"}, "$.provider"),
    ],
)
def test_a_wrong_type_deep_in_params_names_its_json_path(params: Any, path: str) -> None:
    env = envelope({"jsonrpc": "2.0", "id": 1, "method": "agentSession.create", "params": params})
    with pytest.raises(InvalidParams) as info:
        decode_params(env, CreateParams)
    assert f"`{path}`" in info.value.message
    assert info.value.to_wire().code == -32602


def test_a_missing_required_param_is_named() -> None:
    env = envelope({"jsonrpc": "2.0", "id": 1, "method": "agentSession.get", "params": {}})
    with pytest.raises(InvalidParams) as info:
        decode_params(env, GetParams)
    assert "sessionId" in info.value.message


def test_params_use_camel_case_names() -> None:
    env = envelope(
        {"jsonrpc": "2.0", "id": 1, "method": "agentSession.get", "params": {"sessionId": "s1"}}
    )
    assert decode_params(env, GetParams) == GetParams(session_id="s1")


# ---- encoding replies and the client side ---------------------------------------------


def test_success_and_error_replies_round_trip_through_the_client_decoder() -> None:
    ok = decode_client_frame(encode_success(7, {"pong": True}))
    assert [(m.id, msgspec.json.decode(m.result)) for m in ok] == [(7, {"pong": True})]  # type: ignore[arg-type]
    [err] = decode_client_frame(encode_error("a", MethodNotFound("Method not found: x")))
    assert err.id == "a"
    assert isinstance(err.error, ErrorObject)
    assert err.error.code == -32601
    assert err.error.data == {"kind": "method_not_found", "retryable": False}


def test_a_batch_reply_and_a_notification_decode_on_the_client() -> None:
    batch = encode_batch([encode_success(1, None), encode_error(None, ParseError("Parse error"))])
    replies = decode_client_frame(batch)
    assert [r.id for r in replies] == [1, None]
    [note] = decode_client_frame(encode_notification("agentSession.event", {"seq": 1}))
    assert note.method == "agentSession.event"
    assert isinstance(note, ClientIncoming)


def test_the_client_decoder_refuses_garbage_with_a_parse_error() -> None:
    with pytest.raises(ParseError):
        decode_client_frame(b"nope")
    with pytest.raises(ParseError):
        decode_client_frame(b"[" * 100_000)


# ---- every registered wire type round-trips ---------------------------------------------


def strategy_for(t: mi.Type) -> st.SearchStrategy[Any]:
    """Values of a msgspec type, built from ``msgspec.inspect`` (fields by name)."""
    if isinstance(t, mi.StructType):
        required = {f.name: strategy_for(f.type) for f in t.fields if f.required}
        optional = {f.name: strategy_for(f.type) for f in t.fields if not f.required}
        return st.fixed_dictionaries(required, optional=optional).map(lambda kw: t.cls(**kw))
    if isinstance(t, mi.UnionType):
        return st.one_of([strategy_for(member) for member in t.types])
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.ListType):
        return st.lists(strategy_for(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy_for(t.key_type), strategy_for(t.value_type), max_size=3)
    if isinstance(t, mi.Metadata):
        return strategy_for(t.type)
    if isinstance(t, mi.RawType):
        return json_values.map(lambda v: msgspec.Raw(msgspec.json.encode(v)))
    simple: dict[type[mi.Type], st.SearchStrategy[Any]] = {
        mi.NoneType: st.none(),
        mi.BoolType: st.booleans(),
        mi.IntType: st.integers(min_value=-(2**63), max_value=2**64 - 1),
        mi.FloatType: st.floats(allow_nan=False, allow_infinity=False),
        mi.StrType: st.text(max_size=12),
        mi.AnyType: json_values,
    }
    if type(t) in simple:
        return simple[type(t)]
    raise NotImplementedError(f"no strategy for {t!r}: extend strategy_for")


WIRE_TYPES = {
    f"{m.name}:{role}": tp
    for m in METHODS.values()
    for role, tp in (("params", m.params), ("result", m.result))
}


@pytest.mark.parametrize("name", sorted(WIRE_TYPES))
def test_every_registered_wire_type_round_trips(name: str) -> None:
    tp = WIRE_TYPES[name]
    decoder = msgspec.json.Decoder(tp)

    @settings(max_examples=40, deadline=None)
    @given(value=strategy_for(mi.type_info(tp)))
    def round_trip(value: Any) -> None:
        wire = msgspec.json.encode(value)
        assert decoder.decode(wire) == value
        assert msgspec.json.encode(decoder.decode(wire)) == wire

    round_trip()


@pytest.mark.parametrize("name", sorted(WIRE_TYPES))
def test_wire_types_encode_with_camel_case_names(name: str) -> None:
    info = mi.type_info(WIRE_TYPES[name])
    if isinstance(info, mi.StructType):
        for field in info.fields:
            assert "_" not in field.encode_name, (name, field.encode_name)


def test_floats_in_results_survive_the_wire_exactly() -> None:
    for value in (0.1, 1e-300, 1.7976931348623157e308, -0.0, math.pi):
        assert msgspec.json.decode(encode_success(1, value))["result"] == value


@SETTINGS
@given(frame=frames)
def test_is_batch_and_decode_entry_agree_with_decode_frame(frame: bytes) -> None:
    # The daemon's fast path decodes a single request without a DecodedFrame.
    decoded = decode_frame(frame)
    if is_batch(frame):
        assert frame.lstrip()[:1] == b"["
        return
    assert not decoded.is_batch
    assert [comparable(e) for e in decoded.entries] == [comparable(decode_entry(frame))]


def comparable(entry: RequestEnvelope | InvalidEntry) -> object:
    if isinstance(entry, InvalidEntry):
        return encode_error(entry.id, entry.error)  # errors compare by what goes on the wire
    return entry


def test_absent_params_decode_to_one_shared_value_only_when_immutable() -> None:
    ping = envelope({"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"})
    assert ping.params is NO_PARAMS
    first = decode_params(ping, METHODS["daemon.ping"].params)
    assert decode_params(ping, METHODS["daemon.ping"].params) is first
    # A type whose decoded value could be mutated gets a fresh value every time.
    assert decode_params(ping, dict[str, Any]) is not decode_params(ping, dict[str, Any])
    explicit = envelope({"jsonrpc": "2.0", "id": 1, "method": "daemon.ping", "params": {}})
    assert decode_params(explicit, METHODS["daemon.ping"].params) == first
