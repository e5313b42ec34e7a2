"""Forget commands: the four explicit forms, what is not a command, and commands that cannot run."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from yak_pipeline.core.forget import (
    ForgetByIds,
    ForgetByPhrase,
    ForgetCommandError,
    is_memory_id,
    parse_forget_command,
    parse_forget_confirmation,
)

ID1 = "3f2b8c1e-9a4d-4e2f-8b7a-1c2d3e4f5a6b"
ID2 = "a0b1c2d3-e4f5-4a6b-8c7d-9e0f1a2b3c4d"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"/forget {ID1}", ForgetByIds((ID1,))),
        (f"  /FORGET   {ID1.upper()}  ", ForgetByIds((ID1,))),
        (f"/forget {ID1}, {ID2}", ForgetByIds((ID1, ID2))),
        (f"/forget {ID1} {ID2} {ID1}", ForgetByIds((ID1, ID2))),
        ("/forget my old address", ForgetByPhrase("my old address")),
        ("/Forget   I live in  Berlin.  ", ForgetByPhrase("I live in  Berlin.")),
        ('/forget "my sister\'s name"', ForgetByPhrase("my sister's name")),
        ("/forget 'Acme Corp'", ForgetByPhrase("Acme Corp")),
        (f'/forget "{ID1}"', ForgetByPhrase(ID1)),  # quoted means text to search for
        (f"/forget {ID1} and the rest", ForgetByPhrase(f"{ID1} and the rest")),
        (f"delete memory: {ID1}", ForgetByIds((ID1,))),
        (f"DELETE MEMORY:{ID2.upper()}", ForgetByIds((ID2,))),
        (f"  delete  memory :  {ID1}  ", ForgetByIds((ID1,))),
    ],
)
def test_explicit_commands_parse(text: str, expected: ForgetByIds | ForgetByPhrase) -> None:
    assert parse_forget_command(text) == expected


@pytest.mark.parametrize("text", ["forget this memory", "Forget This Memory.", "  FORGET   this memory!  "])
def test_forget_this_memory_uses_the_context_id(text: str) -> None:
    assert parse_forget_command(text, context_memory_id=ID1.upper()) == ForgetByIds((ID1,))


@pytest.mark.parametrize(
    "text",
    [
        "I want to forget about work",
        "please forget",
        "forget",
        "forget it",
        "can you forget this memory please",
        "/forgetful thoughts",
        "forget /forget " + ID1,
        "delete memory",
        "delete my memory: " + ID1,
        "",
        "   ",
        "Remember: never forget this memory",
    ],
)
def test_anything_else_is_not_a_command(text: str) -> None:
    assert parse_forget_command(text, context_memory_id=ID1) is None


@pytest.mark.parametrize(
    ("text", "context", "reason"),
    [
        ("forget this memory", None, "memory in context"),
        ("forget this memory", "  ", "memory in context"),
        ("forget this memory", "not-a-uuid", "invalid id"),
        ("delete memory:", None, "needs a memory id"),
        ("delete memory:   ", None, "needs a memory id"),
        ("delete memory: 12345", None, "UUIDs"),
        (f"delete memory: {ID1}, nope", None, "UUIDs"),
        ("/forget", None, "needs a memory id or a phrase"),
        ("  /FORGET   ", None, "needs a memory id or a phrase"),
        ("/forget , ,", None, "needs a memory id or a phrase"),
        ('/forget ""', None, "empty phrase"),
    ],
)
def test_unusable_commands_raise_a_one_line_reason(text: str, context: str | None, reason: str) -> None:
    with pytest.raises(ForgetCommandError, match=reason) as raised:
        parse_forget_command(text, context_memory_id=context)
    assert "\n" not in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_is_memory_id_needs_the_hyphenated_uuid_form() -> None:
    assert is_memory_id(ID1) and is_memory_id(ID1.upper())
    assert not is_memory_id(ID1.replace("-", ""))
    assert not is_memory_id(ID1 + "0")


@given(st.lists(st.uuids(), min_size=1, max_size=5), st.sampled_from([" ", ", ", ",", "\t"]), st.booleans())
def test_any_list_of_uuids_becomes_ids_in_order(ids: list[uuid.UUID], separator: str, upper: bool) -> None:
    rendered = [str(i).upper() if upper else str(i) for i in ids]
    parsed = parse_forget_command("/forget " + separator.join(rendered))
    assert parsed == ForgetByIds(tuple(dict.fromkeys(str(i) for i in ids)))


@given(st.text(min_size=1).filter(lambda s: s.replace(",", " ").strip() and s.strip()[0] not in "\"'\u201c\u2018"))
def test_a_phrase_is_kept_exact_except_outer_whitespace(phrase: str) -> None:
    parsed = parse_forget_command("/forget " + phrase)
    assert parsed in (ForgetByPhrase(phrase.strip()), ForgetByIds(tuple(dict.fromkeys(
        t.lower() for t in phrase.replace(",", " ").split()))))


def test_a_chat_confirmation_carries_its_token() -> None:
    token = "Zx_3-aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789ab"
    assert parse_forget_confirmation(f"  /forget confirm {token}\n") == token
    assert parse_forget_confirmation(f"/FORGET Confirm {token}") == token
    assert parse_forget_confirmation("/forget confirm short") is None
    assert parse_forget_confirmation(f"/forget confirm {token} please") is None
    assert parse_forget_confirmation("/forget my old address") is None
