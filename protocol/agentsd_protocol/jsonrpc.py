"""JSON-RPC 2.0 envelopes and the two-step decoding of inbound frames.

Rule 1: a frame decodes first into an envelope whose ``params`` stay ``msgspec.Raw``;
the method's own params type decodes them second. An unknown method is therefore
-32601 and bad params are -32602 carrying msgspec's JSON path.

Rule 2: batches follow the specification exactly: an empty array is one Invalid
Request error; a batch of only notifications produces no reply at all; any other
batch produces an array of the replies, in any order.

Rule 3: nothing here performs I/O. ``decode_frame`` turns bytes into ``Incoming``
values or errors; the caller decides what to send.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, Raw, UnsetType

from agentsd_protocol.errors import (
    ErrorObject,
    InvalidParams,
    InvalidRequest,
    ParseError,
    RpcError,
)

RequestId = int | str
T = TypeVar("T")
JSONRPC: Literal["2.0"] = "2.0"
# The envelope's default params. msgspec hands out this very object when a request
# has no params, so an identity test spots them without looking at bytes.
NO_PARAMS = Raw(b"{}")


class RequestEnvelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An inbound request or notification; ``id`` is UNSET for a notification."""

    jsonrpc: Literal["2.0"]
    method: str
    params: Raw = NO_PARAMS
    id: RequestId | UnsetType | None = UNSET

    @property
    def is_notification(self) -> bool:
        return self.id is UNSET


class _IdProbe(msgspec.Struct):
    """Salvages the id of an invalid request so its error can carry it."""

    id: Any = None


class Request(msgspec.Struct, frozen=True, omit_defaults=True):
    jsonrpc: Literal["2.0"]
    method: str
    params: Any = None
    id: RequestId | UnsetType = UNSET


class Notification(msgspec.Struct, frozen=True):
    jsonrpc: Literal["2.0"]
    method: str
    params: Any


class SuccessResponse(msgspec.Struct, frozen=True):
    jsonrpc: Literal["2.0"]
    id: RequestId | None
    result: Any


class ErrorResponse(msgspec.Struct, frozen=True):
    jsonrpc: Literal["2.0"]
    id: RequestId | None
    error: ErrorObject


class ClientIncoming(msgspec.Struct, frozen=True):
    """What a client may receive: a response (id + result/error) or a notification."""

    jsonrpc: Literal["2.0"]
    id: RequestId | UnsetType | None = UNSET
    result: Raw | UnsetType = UNSET
    error: ErrorObject | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: Raw | UnsetType = UNSET


class InvalidEntry(msgspec.Struct, frozen=True):
    """A frame (or batch member) that cannot be processed; reply with ``error``."""

    id: RequestId | None
    error: RpcError


Incoming = RequestEnvelope | InvalidEntry


class DecodedFrame(msgspec.Struct, frozen=True):
    """The result of decoding one frame.

    ``is_batch`` tells whether replies must be sent as one JSON array.
    """

    entries: list[Incoming]
    is_batch: bool


_envelope_decoder = msgspec.json.Decoder(RequestEnvelope)
_batch_decoder = msgspec.json.Decoder(list[Raw])
_probe_decoder = msgspec.json.Decoder(_IdProbe)
_json_checker = msgspec.json.Decoder()  # any well-formed JSON text
_encoder = msgspec.json.Encoder()
# One decoder per params type, built on first use: a Decoder does the type's lookup
# work once, where ``msgspec.json.decode(type=...)`` repeats it on every call.
_params_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}
# What a request without params decodes to, per frozen params type: the common case
# of ``daemon.ping`` and friends skips decoding altogether.
_absent_params: dict[type[Any], Any] = {}
# msgspec raises RecursionError (not DecodeError) past the interpreter's recursion
# limit, e.g. for "[[[[..." from a hostile client; it is still a parse error.
_TOO_DEEP = "Parse error: JSON nested too deeply"


def _salvage_id(raw: bytes | Raw) -> RequestId | None:
    try:
        probe = _probe_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(probe.id, int | str) and not isinstance(probe.id, bool):
        return probe.id
    return None


def _decode_one(raw: bytes | Raw) -> Incoming:
    try:
        envelope = _envelope_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        # msgspec validates before it reaches a syntax error later in the text (e.g.
        # trailing garbage); the spec wants malformed JSON to be a parse error.
        try:
            _json_checker.decode(raw)
        except msgspec.DecodeError as syntax:
            return InvalidEntry(id=None, error=ParseError(f"Parse error: {syntax}"))
        except RecursionError:
            return InvalidEntry(id=None, error=ParseError(_TOO_DEEP))
        return InvalidEntry(id=_salvage_id(raw), error=InvalidRequest(f"Invalid request: {exc}"))
    except msgspec.DecodeError as exc:
        return InvalidEntry(id=None, error=ParseError(f"Parse error: {exc}"))
    except RecursionError:
        return InvalidEntry(id=None, error=ParseError(_TOO_DEEP))
    params = envelope.params
    if params is not NO_PARAMS and bytes(params)[:1] not in (b"{", b"["):
        return InvalidEntry(
            id=_request_id(envelope),
            error=InvalidRequest("Invalid request: params must be an object or an array"),
        )
    return envelope


def _request_id(envelope: RequestEnvelope) -> RequestId | None:
    return None if isinstance(envelope.id, UnsetType) else envelope.id


def is_batch(frame: bytes) -> bool:
    """True when ``frame`` holds a JSON array (a batch): ``decode_frame`` it. Any
    other frame is one entry: ``decode_entry`` it, without the ``DecodedFrame``."""
    first = frame[:1]
    if first == b"{":
        return False  # the common case, without copying the frame to strip it
    return first == b"[" or frame.lstrip(b" \t\r\n")[:1] == b"["


def decode_entry(frame: bytes) -> Incoming:
    """Decode one frame that is not a batch (see ``is_batch``) into its envelope, or
    the error to reply with. Never raises."""
    return _decode_one(frame)


def decode_frame(frame: bytes) -> DecodedFrame:
    """Decode one framed JSON text into envelopes or per-entry errors.

    Never raises: malformed input becomes ``InvalidEntry`` values.
    """
    if is_batch(frame):
        try:
            members = _batch_decoder.decode(frame)
        except msgspec.DecodeError as exc:
            return DecodedFrame(
                entries=[InvalidEntry(id=None, error=ParseError(f"Parse error: {exc}"))],
                is_batch=False,
            )
        except RecursionError:
            return DecodedFrame(
                entries=[InvalidEntry(id=None, error=ParseError(_TOO_DEEP))], is_batch=False
            )
        if not members:
            return DecodedFrame(
                entries=[
                    InvalidEntry(id=None, error=InvalidRequest("Invalid request: empty batch"))
                ],
                is_batch=False,
            )
        return DecodedFrame(entries=[_decode_one(m) for m in members], is_batch=True)
    return DecodedFrame(entries=[_decode_one(frame)], is_batch=False)


def decode_params(envelope: RequestEnvelope, params_type: type[T]) -> T:
    """Second decoding step: the method's params type, or ``InvalidParams``."""
    raw = envelope.params
    if raw is NO_PARAMS:
        absent = _absent_params.get(params_type)
        if absent is not None:
            return absent  # type: ignore[no-any-return]
    elif bytes(raw)[:1] == b"[":
        raise InvalidParams("Invalid params: agentsd methods take params by name (an object)")
    decoder = _params_decoders.get(params_type)
    if decoder is None:
        decoder = _params_decoders[params_type] = msgspec.json.Decoder(params_type)
    try:
        params: T = decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidParams(f"Invalid params: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidParams(f"Invalid params: {exc}") from None
    except RecursionError:
        raise InvalidParams("Invalid params: JSON nested too deeply") from None
    if raw is NO_PARAMS and _is_immutable(params):
        _absent_params[params_type] = params  # one value can serve every call
    return params


def _is_immutable(value: Any) -> bool:
    """A frozen Struct whose fields hold only scalars: safe to share between calls."""
    if not isinstance(value, msgspec.Struct) or not value.__struct_config__.frozen:
        return False
    return all(isinstance(field, _SCALARS) for field in msgspec.structs.astuple(value))


_SCALARS = (type(None), bool, int, float, str)


def encode_success(request_id: RequestId | None, result: Any) -> bytes:
    return _encoder.encode(SuccessResponse(jsonrpc=JSONRPC, id=request_id, result=result))


def encode_error(request_id: RequestId | None, error: RpcError) -> bytes:
    return _encoder.encode(ErrorResponse(jsonrpc=JSONRPC, id=request_id, error=error.to_wire()))


def encode_notification(method: str, params: Any) -> bytes:
    return _encoder.encode(Notification(jsonrpc=JSONRPC, method=method, params=params))


def encode_request(method: str, params: Any, request_id: RequestId | None) -> bytes:
    if request_id is None:
        return _encoder.encode(Request(jsonrpc=JSONRPC, method=method, params=params))
    return _encoder.encode(Request(jsonrpc=JSONRPC, method=method, params=params, id=request_id))


def encode_batch(replies: list[bytes]) -> bytes:
    """Join already-encoded replies into one JSON array."""
    return b"[" + b",".join(replies) + b"]"


_client_decoder = msgspec.json.Decoder(ClientIncoming | list[ClientIncoming])


def decode_client_frame(frame: bytes) -> list[ClientIncoming]:
    """Client side: one frame into responses and notifications; ``ParseError`` if the
    daemon sent something that is not JSON-RPC."""
    try:
        decoded = _client_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise ParseError(f"Parse error in a message from the daemon: {exc}") from None
    except RecursionError:
        raise ParseError(_TOO_DEEP) from None
    return decoded if isinstance(decoded, list) else [decoded]
