"""Showing untrusted text: bounded excerpts and escaped control characters."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentsd_protocol.display import MAX_EXCERPT_CHARS, excerpt, printable


def test_a_short_value_is_quoted_whole() -> None:
    assert excerpt("abc") == "'abc'"


def test_a_long_value_is_cut_with_an_ellipsis_and_its_length_in_bytes() -> None:
    text = "é" * 1_000_000
    shown = excerpt(text)
    assert shown.endswith("… (2000000 bytes)")
    assert len(shown) < MAX_EXCERPT_CHARS + 40


def test_terminal_escapes_are_made_visible() -> None:
    assert printable("\x1b]0;x\x07a\tb\nc\x9b") == "\\x1b]0;x\\x07a\\tb\\nc\\x9b"
    assert printable("a\tb\nc\x1b[2J", layout=True) == "a\tb\nc\\x1b[2J"


@given(st.text())
def test_printable_text_has_no_control_characters(text: str) -> None:
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in printable(text))
    shown = excerpt(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)
