"""The error taxonomy: unique codes in range, stable kinds, and a lossless round-trip
from exception to wire and back."""

from __future__ import annotations

import msgspec
import pytest

from agentsd_protocol import errors
from agentsd_protocol.errors import (
    ErrorObject,
    InternalError,
    RpcError,
    StaleFence,
    error_classes,
    error_from_wire,
)
from agentsd_protocol.jsonrpc import encode_error

SPEC_CODES = range(-32700, -32600 + 1)
APP_CODES = range(-32099, -32000 + 1)


def all_error_classes() -> list[type[RpcError]]:
    found: list[type[RpcError]] = []
    pending = list(RpcError.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.code, reverse=True)


ALL = all_error_classes()


def test_every_error_class_is_in_the_module_and_in_the_table() -> None:
    assert {
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, RpcError)
    } >= set(ALL)
    assert set(error_classes().values()) == set(ALL)


def test_codes_are_unique_and_in_range() -> None:
    codes = [cls.code for cls in ALL]
    assert len(codes) == len(set(codes)), codes
    for cls in ALL:
        assert cls.code in SPEC_CODES or cls.code in APP_CODES, cls


def test_the_five_spec_codes() -> None:
    table = error_classes()
    assert {code: table[code].kind for code in (-32700, -32600, -32601, -32602, -32603)} == {
        -32700: "parse_error",
        -32600: "invalid_request",
        -32601: "method_not_found",
        -32602: "invalid_params",
        -32603: "internal",
    }


def test_kinds_are_unique_stable_identifiers() -> None:
    kinds = [cls.kind for cls in ALL]
    assert len(kinds) == len(set(kinds)), kinds
    for kind in kinds:
        assert kind.isascii() and kind == kind.lower() and " " not in kind, kind


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_error_from_wire_rebuilds_the_same_class(cls: type[RpcError]) -> None:
    original = cls("something went wrong", sessionId="s-1", currentFence=3)
    wire = msgspec.json.decode(msgspec.json.encode(original.to_wire()), type=ErrorObject)
    assert wire.data is not None
    assert wire.data["kind"] == cls.kind
    assert wire.data["retryable"] is cls.retryable
    rebuilt = error_from_wire(wire)
    assert type(rebuilt) is cls
    assert rebuilt.message == original.message
    assert rebuilt.details == original.details
    assert (rebuilt.code, rebuilt.kind, rebuilt.retryable) == (cls.code, cls.kind, cls.retryable)
    assert rebuilt.to_wire() == original.to_wire()


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_error_reply_carries_kind_and_retryable(cls: type[RpcError]) -> None:
    reply = msgspec.json.decode(encode_error(1, cls("boom")))
    assert reply["error"]["code"] == cls.code
    assert set(reply["error"]["data"]) == {"kind", "retryable"}
    assert isinstance(reply["error"]["data"]["retryable"], bool)


def test_an_unknown_code_keeps_its_code_and_kind() -> None:
    wire = ErrorObject(code=-32098, message="from the future", data={"kind": "future", "x": 1})
    rebuilt = error_from_wire(wire)
    assert type(rebuilt) is RpcError
    assert (rebuilt.code, rebuilt.kind) == (-32098, "future")
    assert rebuilt.details == {"x": 1}


def test_an_error_without_data_still_rebuilds() -> None:
    rebuilt = error_from_wire(ErrorObject(code=-32003, message="stale"))
    assert type(rebuilt) is StaleFence
    assert rebuilt.details == {}


def test_no_traceback_on_the_wire() -> None:
    try:
        raise ValueError("secret internals")
    except ValueError:
        error = InternalError("internal error; see the daemon log")
    wire = msgspec.json.decode(encode_error(None, error))
    text = msgspec.json.encode(wire).decode()
    assert "Traceback" not in text
    assert "secret internals" not in text
    for cls in ALL:
        assert "Traceback" not in msgspec.json.encode(cls("x").to_wire()).decode()


def test_repr_names_the_class() -> None:
    assert repr(StaleFence("stale", currentFence=2)) == "StaleFence('stale', {'currentFence': 2})"
