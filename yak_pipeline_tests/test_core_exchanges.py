"""Exchanges: formatting, parsing back, and the normalisation the content hash is taken over."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from yak_pipeline.core.exchanges import (
    content_sha256,
    format_exchange,
    normalise_exchange_text,
    parse_exchange,
)


def test_format_and_parse_an_exchange() -> None:
    text = format_exchange("Where do I live?", "In Berlin.")
    assert text == "User: Where do I live?\nAssistant: In Berlin."
    assert parse_exchange(text) == ("Where do I live?", "In Berlin.")


def test_parse_rejects_other_shapes_and_keeps_multiline_replies() -> None:
    assert parse_exchange("just a note") is None
    assert parse_exchange("Assistant: hi\nUser: hello") is None
    assert parse_exchange("User: a\r\nAssistant: line 1\nAssistant: line 2") == ("a", "line 1\nAssistant: line 2")
    assert parse_exchange(normalise_exchange_text(format_exchange("", "x"))) == ("", "x")


def test_normalisation_fixes_line_endings_and_trailing_space_only() -> None:
    raw = "\r\n  \nUser:  indented  \r\n\r\n  Assistant: ok\t\r\n\n  \n"
    assert normalise_exchange_text(raw) == "User:  indented\n\n  Assistant: ok"
    assert normalise_exchange_text("a\rb") == "a\nb"
    assert normalise_exchange_text("   \n\n") == ""


def test_same_exchange_hashes_the_same_however_it_arrived() -> None:
    unix = format_exchange("hi", "hello")
    windows = "\r\n" + unix.replace("\n", "\r\n") + "  \r\n"
    assert content_sha256(unix) == content_sha256(windows)
    assert content_sha256(unix) == hashlib.sha256(unix.encode()).hexdigest()
    assert content_sha256(unix) != content_sha256(format_exchange("hi", "hello!"))


@given(st.text())
def test_normalisation_is_idempotent(text: str) -> None:
    once = normalise_exchange_text(text)
    assert normalise_exchange_text(once) == once
    assert "\r" not in once
    assert content_sha256(text) == content_sha256(once)


line_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"))


@given(line_text, st.lists(line_text, min_size=1, max_size=4).map("\n".join))
def test_parse_exchange_round_trips(user: str, assistant: str) -> None:
    assert parse_exchange(format_exchange(user, assistant)) == (user, assistant)


def test_a_turn_is_refused_for_what_the_turns_route_refuses() -> None:
    from yak_pipeline.core.exchanges import MAX_TURN_MESSAGE_CHARS, turn_refusal

    assert turn_refusal("hi", "hello") is None
    assert turn_refusal("  ", "hello") == "the user message is blank"
    assert turn_refusal("hi", "a\x00b") == "the assistant message contains NUL characters"
    assert turn_refusal("x" * (MAX_TURN_MESSAGE_CHARS + 1), "ok") == "the user message is longer than 200,000 characters"
