"""Showing text that came from a user or an agent to a human, safely.

Rule 1: an error message quotes bad input by ``excerpt``: at most
``MAX_EXCERPT_CHARS`` characters of it, quoted with control characters escaped, and
when cut, an ellipsis and the input's whole length in bytes. A 1 MiB value is never
echoed back whole.

Rule 2: text printed to a terminal goes through ``printable``: control characters
(C0 but the ones named in ``keep``, DEL, C1) become visible escapes, so a title or an
agent's output cannot move the cursor, retitle the window or hide what follows.
"""

from __future__ import annotations

import re

MAX_EXCERPT_CHARS = 80  # enough to recognise a value; an error line stays one line

# C0 controls, DEL and C1 controls (U+0080..U+009F: 8-bit CSI and friends).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROLS_BUT_LAYOUT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # keeps \t and \n


def excerpt(text: str, limit: int = MAX_EXCERPT_CHARS) -> str:
    """``text`` quoted for an error message (Rule 1)."""
    if len(text) <= limit:
        return repr(text)
    size = len(text.encode("utf-8", "surrogatepass"))
    return f"{text[:limit]!r}… ({size} bytes)"


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(char, f"\\x{ord(char):02x}")


def printable(text: str, *, layout: bool = False) -> str:
    """``text`` with control characters escaped (Rule 2); with ``layout``, tabs and
    newlines are kept (multi-line agent output), else escaped too (one table cell)."""
    pattern = _CONTROLS_BUT_LAYOUT if layout else _CONTROLS
    return pattern.sub(_escape, text)
