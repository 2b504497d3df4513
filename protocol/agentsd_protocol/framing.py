"""Sans-IO framing for both wire framings, with auto-detection.

Rule 1: the first non-whitespace bytes of a connection choose the framing for its
whole life: ``Content-Length:`` headers (LSP base protocol) or one JSON text per line
(newline-delimited JSON). Replies use the same framing.

Rule 2: a frame never exceeds ``max_frame_bytes``; the decoder raises
``FrameTooLarge`` as soon as it knows, without buffering the rest.

Rule 3: however the byte stream is chunked, the same frames come out. Arbitrary bytes
raise only ``ParseError`` or ``FrameTooLarge``; after either, the decoder is unusable
and the connection should be closed.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator

from agentsd_protocol.errors import FrameTooLarge, ParseError

DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024  # large diffs fit; a runaway client does not
MAX_HEADER_BYTES = 4096  # LSP headers are two short lines; anything longer is garbage
_HEADER_END = b"\r\n\r\n"
_WHITESPACE = b" \t\r\n"


class Framing(enum.Enum):
    CONTENT_LENGTH = "content-length"
    NDJSON = "ndjson"


def encode_frame(framing: Framing, body: bytes) -> bytes:
    """Frame one encoded JSON text. ``body`` must not contain a raw newline for NDJSON
    (msgspec's encoder never emits one)."""
    if framing is Framing.NDJSON:
        return body + b"\n"
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


class FrameDecoder:
    """Incremental decoder: ``feed`` bytes, then iterate ``frames()``.

    ``framing`` is None until the first non-whitespace byte arrives, unless it was
    given up front (a client knows what it speaks).
    """

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        framing: Framing | None = None,
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.framing = framing
        self._buf = bytearray()
        self._scan_from = 0  # NDJSON: bytes before this offset hold no newline
        self._body_len: int | None = None  # Content-Length: length of the pending body
        self._broken = False

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame (an unfinished frame)."""
        return len(self._buf)

    @property
    def in_frame(self) -> bool:
        """True while a frame has begun and not yet completed: bytes are buffered, or
        a Content-Length header was read and its body has not all arrived."""
        return bool(self._buf) or self._body_len is not None

    def feed(self, data: bytes) -> None:
        if self._broken:
            raise ParseError("Parse error: the stream is already broken")
        self._buf += data

    def feed_frames(self, data: bytes) -> Iterable[bytes]:
        """``feed(data)``, then iterate the complete frames: the same frames and the
        same errors, at the same points of the iteration, as ``feed`` and ``frames``.

        A reading loop's one call per read. In the common case (newline framing
        decided, nothing buffered, a read no larger than the frame bound, so no line
        in it can break the bound) the read is split at once instead of being copied
        through the buffer frame by frame.
        """
        if (
            self.framing is not Framing.NDJSON
            or self._buf
            or self._broken
            or len(data) > self.max_frame_bytes
        ):
            self.feed(data)
            return self.frames()
        lines = data.split(b"\n")
        tail = lines.pop()
        if tail:
            self._buf += tail
            self._scan_from = len(tail)
        return [line for line in lines if line.strip(_WHITESPACE)]

    def frames(self) -> Iterator[bytes]:
        """Yield every complete frame buffered so far."""
        while True:
            frame = self._next()
            if frame is None:
                return
            yield frame

    def _next(self) -> bytes | None:
        if self.framing is None:
            self._detect()
            if self.framing is None:
                return None
        try:
            if self.framing is Framing.NDJSON:
                return self._next_line()
            return self._next_content_length()
        except (ParseError, FrameTooLarge):
            self._broken = True
            raise

    def _detect(self) -> None:
        stripped = self._buf.lstrip(_WHITESPACE)
        if not stripped:
            self._buf.clear()
            return
        del self._buf[: len(self._buf) - len(stripped)]
        first = bytes(stripped[:1])
        if first in (b"{", b"["):
            self.framing = Framing.NDJSON
            return
        # Anything else must be an LSP header block; decide once we can see it.
        prefix = b"content-"
        head = bytes(stripped[: len(prefix)]).lower()
        if prefix.startswith(head):
            if len(head) == len(prefix):
                self.framing = Framing.CONTENT_LENGTH
            return
        self._broken = True
        raise ParseError("Parse error: a frame must start with '{', '[' or a Content-Length header")

    def _next_line(self) -> bytes | None:
        while True:
            newline = self._buf.find(b"\n", self._scan_from)
            if newline < 0:
                self._scan_from = len(self._buf)
                if len(self._buf) > self.max_frame_bytes:
                    raise FrameTooLarge(
                        f"Frame larger than {self.max_frame_bytes} bytes",
                        maxFrameBytes=self.max_frame_bytes,
                    )
                return None
            line = bytes(self._buf[:newline])
            del self._buf[: newline + 1]
            self._scan_from = 0
            if len(line) > self.max_frame_bytes:
                raise FrameTooLarge(
                    f"Frame larger than {self.max_frame_bytes} bytes",
                    maxFrameBytes=self.max_frame_bytes,
                )
            if line.strip(_WHITESPACE):
                return line

    def _next_content_length(self) -> bytes | None:
        if self._body_len is None:
            # Tolerate whitespace (stray newlines) between messages.
            stripped = self._buf.lstrip(_WHITESPACE)
            if len(stripped) != len(self._buf):
                del self._buf[: len(self._buf) - len(stripped)]
            end = self._buf.find(_HEADER_END)
            if end < 0:
                if len(self._buf) > MAX_HEADER_BYTES:
                    raise ParseError("Parse error: header block too long")
                return None
            if end > MAX_HEADER_BYTES:
                raise ParseError("Parse error: header block too long")
            self._body_len = self._parse_headers(bytes(self._buf[:end]))
            del self._buf[: end + len(_HEADER_END)]
        if len(self._buf) < self._body_len:
            return None
        body = bytes(self._buf[: self._body_len])
        del self._buf[: self._body_len]
        self._body_len = None
        return body

    def _parse_headers(self, block: bytes) -> int:
        length: int | None = None
        for line in block.split(b"\r\n"):
            name, sep, value = line.partition(b":")
            if not sep:
                raise ParseError("Parse error: malformed header line")
            key = name.strip().lower()
            if key == b"content-length":
                text = value.strip()
                if not text.isdigit() or len(text) > 12:
                    raise ParseError("Parse error: invalid Content-Length")
                length = int(text)
            elif key == b"content-type":
                continue
            else:
                raise ParseError("Parse error: unknown header")
        if length is None:
            raise ParseError("Parse error: missing Content-Length header")
        if length > self.max_frame_bytes:
            raise FrameTooLarge(
                f"Frame of {length} bytes is larger than {self.max_frame_bytes} bytes",
                maxFrameBytes=self.max_frame_bytes,
            )
        return length
