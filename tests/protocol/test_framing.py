"""Both framings, sans-IO: however a byte stream is chunked, the same frames come out,
and arbitrary bytes raise only protocol errors."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsd_protocol.errors import FrameTooLarge, ParseError
from agentsd_protocol.framing import MAX_HEADER_BYTES, FrameDecoder, Framing, encode_frame

SETTINGS = settings(max_examples=100, deadline=None)

# Frame contents barely matter to framing; strings carry the interesting bytes
# (newlines and quotes, escaped by the encoder) and cheap values keep examples fast.
json_values = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=20)
    | st.lists(st.integers() | st.text(max_size=8), max_size=4)
)
# JSON-RPC messages are objects (or arrays, for batches); NDJSON detection needs one first.
json_messages = st.dictionaries(st.text(max_size=8), json_values, max_size=4) | st.lists(
    json_values, max_size=4
)
bodies = st.lists(json_messages.map(msgspec.json.encode), min_size=1, max_size=8)
whitespace = st.text(alphabet=" \t\r\n", max_size=6).map(str.encode)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(max(c, 0), len(data)) for c in cuts})
    pieces: list[bytes] = []
    start = 0
    for point in [*points, len(data)]:
        pieces.append(data[start:point])
        start = point
    return pieces


def feed_all(decoder: FrameDecoder, pieces: list[bytes]) -> list[bytes]:
    frames: list[bytes] = []
    for piece in pieces:
        decoder.feed(piece)
        frames.extend(decoder.frames())
    return frames


def chunks_of(data: bytes) -> st.SearchStrategy[list[bytes]]:
    return st.lists(st.integers(0, len(data)), max_size=12).map(lambda cuts: split_at(data, cuts))


@SETTINGS
@given(framing=st.sampled_from(Framing), frames=bodies, data=st.data())
def test_any_rechunking_yields_the_same_frames(
    framing: Framing, frames: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(encode_frame(framing, body) for body in frames)
    pieces = data.draw(chunks_of(stream))
    decoder = FrameDecoder(framing=framing)
    assert feed_all(decoder, pieces) == frames
    assert decoder.buffered == 0


@SETTINGS
@given(framing=st.sampled_from(Framing), frames=bodies, lead=whitespace, data=st.data())
def test_detection_survives_rechunking_and_leading_whitespace(
    framing: Framing, frames: list[bytes], lead: bytes, data: st.DataObject
) -> None:
    stream = lead + b"".join(encode_frame(framing, body) for body in frames)
    pieces = data.draw(chunks_of(stream))
    decoder = FrameDecoder()
    assert feed_all(decoder, pieces) == frames
    assert decoder.framing is framing


@SETTINGS
@given(framing=st.sampled_from(Framing), frames=bodies, data=st.data())
def test_a_frame_at_the_limit_passes_and_one_byte_over_fails_under_any_chunking(
    framing: Framing, frames: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(encode_frame(framing, body) for body in frames)
    pieces = data.draw(chunks_of(stream))
    largest = max(len(body) for body in frames)

    assert feed_all(FrameDecoder(max_frame_bytes=largest), pieces) == frames

    decoder = FrameDecoder(max_frame_bytes=largest - 1)
    got: list[bytes] = []
    with pytest.raises(FrameTooLarge) as info:
        for piece in pieces:
            decoder.feed(piece)
            got.extend(decoder.frames())
    assert got == frames[: len(got)]
    assert all(len(frame) < largest for frame in got)
    assert info.value.details == {"maxFrameBytes": largest - 1}


header_noise = st.sampled_from(
    [
        b"Content-Length: 2\r\n\r\n{}",
        b"content-length:7\r\nContent-Type: application/json\r\n\r\n",
        b"Content-Length: -1\r\n\r\n",
        b"Content-Length: 99999999999999999\r\n\r\n",
        b"Content-Length: 1\r\nX-Other: 1\r\n\r\n",
        b"Content-Length 4\r\n\r\n",
        b"\r\n\r\n",
        b"{}\n",
        b"[]\n",
        b"\n",
        b"\xff",
    ]
)


@SETTINGS
@given(
    pieces=st.lists(st.binary(max_size=64) | header_noise, max_size=12),
    max_frame=st.integers(min_value=0, max_value=256),
    framing=st.none() | st.sampled_from(Framing),
)
def test_arbitrary_bytes_raise_only_protocol_errors(
    pieces: list[bytes], max_frame: int, framing: Framing | None
) -> None:
    decoder = FrameDecoder(max_frame_bytes=max_frame, framing=framing)
    try:
        for piece in pieces:
            decoder.feed(piece)
            for frame in decoder.frames():
                assert isinstance(frame, bytes)
                assert len(frame) <= max_frame
    except (ParseError, FrameTooLarge):
        # Rule 3: after a protocol error the decoder stays unusable.
        with pytest.raises(ParseError):
            decoder.feed(b"{}\n")


@SETTINGS
@given(junk=st.binary(min_size=1, max_size=2 * MAX_HEADER_BYTES + 64))
def test_a_header_block_never_grows_without_bound(junk: bytes) -> None:
    decoder = FrameDecoder(framing=Framing.CONTENT_LENGTH)
    decoder.feed(b"Content-Length: 5" + junk.replace(b"\r\n\r\n", b"\r\n  "))
    try:
        list(decoder.frames())
    except (ParseError, FrameTooLarge):
        return
    assert decoder.buffered <= MAX_HEADER_BYTES + len(b"Content-Length: 5")


def frames_of(stream: bytes, **kwargs: Any) -> list[bytes]:
    decoder = FrameDecoder(**kwargs)
    decoder.feed(stream)
    return list(decoder.frames())


def test_encode_frame_content_length_counts_bytes_not_characters() -> None:
    body = msgspec.json.encode({"text": "é€😀"})
    assert encode_frame(Framing.CONTENT_LENGTH, body) == b"Content-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    assert frames_of(encode_frame(Framing.CONTENT_LENGTH, body)) == [body]


def test_ndjson_skips_blank_lines_and_accepts_crlf() -> None:
    assert frames_of(b'{"a":1}\r\n\n   \n[2]\n') == [b'{"a":1}\r', b"[2]"]
    assert msgspec.json.decode(b'{"a":1}\r') == {"a": 1}


def test_content_length_headers_are_case_insensitive_and_content_type_is_allowed() -> None:
    stream = (
        b"content-length: 2\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n{}"
        b"\r\n"  # stray whitespace between messages is tolerated
        b"CONTENT-LENGTH:2\r\n\r\n[]"
    )
    decoder = FrameDecoder()
    decoder.feed(stream)
    assert list(decoder.frames()) == [b"{}", b"[]"]
    assert decoder.framing is Framing.CONTENT_LENGTH


def test_framing_is_not_decided_by_whitespace_alone() -> None:
    decoder = FrameDecoder()
    decoder.feed(b" \r\n\t ")
    assert list(decoder.frames()) == []
    assert decoder.framing is None
    assert decoder.buffered == 0


def test_framing_waits_for_enough_of_a_header_to_decide() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"Conte")
    assert list(decoder.frames()) == []
    assert decoder.framing is None
    decoder.feed(b"nt-Length: 2\r\n\r\n{}")
    assert list(decoder.frames()) == [b"{}"]
    assert decoder.framing is Framing.CONTENT_LENGTH


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(b"hello\n", id="not-json-not-header"),
        pytest.param(b"Content-Type: x\r\n\r\n{}", id="missing-content-length"),
        pytest.param(b"Content-Length: x\r\n\r\n", id="non-numeric-length"),
        pytest.param(b"Content-Length: -2\r\n\r\n", id="negative-length"),
        pytest.param(b"Content-Length: 2\r\nX-Foo: 1\r\n\r\n{}", id="unknown-header"),
        pytest.param(b"Content-Length: 2\r\nbroken\r\n\r\n{}", id="header-without-colon"),
        pytest.param(b"Content-Length: " + b"1" * 13 + b"\r\n\r\n", id="absurd-length"),
        pytest.param(b"Content-Length: 2" + b" " * MAX_HEADER_BYTES, id="endless-header"),
    ],
)
def test_malformed_streams_are_parse_errors(stream: bytes) -> None:
    with pytest.raises(ParseError):
        frames_of(stream)


def test_oversize_content_length_fails_before_the_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=10)
    decoder.feed(b"Content-Length: 11\r\n\r\n")
    with pytest.raises(FrameTooLarge) as info:
        list(decoder.frames())
    assert info.value.code == -32000
    assert info.value.to_wire().data == {
        "kind": "frame_too_large",
        "retryable": False,
        "maxFrameBytes": 10,
    }


def test_oversize_ndjson_fails_before_the_newline_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=10)
    decoder.feed(b"{" + b" " * 10)
    with pytest.raises(FrameTooLarge):
        list(decoder.frames())


def test_a_decoder_given_its_framing_does_not_detect() -> None:
    # A client knows what it speaks; '{' in a Content-Length stream is garbage.
    with pytest.raises(ParseError):
        frames_of(b"{}\r\n\r\n", framing=Framing.CONTENT_LENGTH)


def outcome_of(decoder: FrameDecoder, pieces: list[bytes], *, at_once: bool) -> list[object]:
    """Every frame, and the error that ended the stream (its class and details), in order."""
    got: list[object] = []
    try:
        for piece in pieces:
            if at_once:
                got.extend(decoder.feed_frames(piece))
            else:
                decoder.feed(piece)
                got.extend(decoder.frames())
    except (ParseError, FrameTooLarge) as exc:
        got.append((type(exc), exc.details))
    got.append(decoder.buffered)
    return got


@SETTINGS
@given(
    pieces=st.lists(
        st.binary(max_size=64) | header_noise | bodies.map(b"\n".join) | whitespace, max_size=12
    ),
    max_frame=st.integers(min_value=0, max_value=256),
    framing=st.none() | st.sampled_from(Framing),
)
def test_feed_frames_yields_what_feed_and_frames_yield(
    pieces: list[bytes], max_frame: int, framing: Framing | None
) -> None:
    # feed_frames splits newline-delimited reads directly; frames, errors and what
    # stays buffered must be exactly those of the frame-by-frame path.
    expected = outcome_of(FrameDecoder(max_frame, framing), pieces, at_once=False)
    assert outcome_of(FrameDecoder(max_frame, framing), pieces, at_once=True) == expected


@SETTINGS
@given(frames=bodies, data=st.data())
def test_feed_frames_keeps_a_partial_line_for_the_next_read(
    frames: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(encode_frame(Framing.NDJSON, body) for body in frames)
    pieces = data.draw(chunks_of(stream))
    decoder = FrameDecoder(framing=Framing.NDJSON)
    got: list[bytes] = []
    consumed = b""
    for piece in pieces:
        got.extend(decoder.feed_frames(piece))
        consumed += piece
        # Rule 5 of the connection times exactly this: a line begun and not finished.
        assert decoder.in_frame == (consumed != b"" and not consumed.endswith(b"\n"))
    assert got == frames
    assert not decoder.in_frame
