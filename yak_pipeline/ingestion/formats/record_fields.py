"""The fields of Yak's own drop records as pydantic types, and a validation error as a reject's reason.

A JSON record (:mod:`~yak_pipeline.ingestion.formats.yak_json`) and a transcript's front matter
(:mod:`~yak_pipeline.ingestion.formats.yak_markdown`) are validated by pydantic models built once
from these types, so every reason names its field: ``user: field required``, ``occurred_at:
'yesterday' is not an ISO-8601 date or datetime``. The checks themselves are the ones every reader
shares (:mod:`~yak_pipeline.ingestion.formats.exchange_records`); each type's validator replaces
pydantic's own (no coercion: a number is not a user id), and its message is the check's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Final, TypeVar

from pydantic import AfterValidator, PlainValidator, Strict, ValidationError
from pydantic_core import PydanticCustomError

from yak_pipeline.core.exchanges import parse_exchange
from yak_pipeline.core.types import InvalidUserId, validate_user_id
from yak_pipeline.ingestion.formats.exchange_records import RecordError, json_kind, storable_problem, timestamp_of

T = TypeVar("T")

EXCHANGE_FORM: Final = "'User: …\\nAssistant: …'"
_ERROR_TYPE: Final = "yak_record"


def _field_error(problem: str) -> PydanticCustomError:
    # The message is a template: user input in it ("{x}") must not be read as a placeholder.
    return PydanticCustomError(_ERROR_TYPE, "{problem}", {"problem": problem})


def _checked(check: Callable[[object], T]) -> Callable[[object], T]:
    """``check`` as a validator: its :class:`RecordError` (or invalid user id) becomes the field's error."""

    def validate(value: object) -> T:
        try:
            return check(value)
        except (RecordError, InvalidUserId) as error:
            raise _field_error(str(error)) from None

    return validate


def _user_id(value: object) -> str:
    if not isinstance(value, str):
        raise RecordError(f"must be a string, got {json_kind(value)}")
    return validate_user_id(value)


def _message_text(value: str) -> str:
    text = value.strip()
    if not text:
        raise _field_error("is empty")
    problem = storable_problem(text)
    if problem is not None:
        raise _field_error(problem)
    return text


def _exchange_parts(value: object) -> tuple[str, str]:
    if not isinstance(value, str):
        raise _field_error(f"must be a string, got {json_kind(value)}")
    parts = parse_exchange(value.strip())
    if parts is None:
        raise _field_error(f"not in {EXCHANGE_FORM} form")
    user, assistant = (part.strip() for part in parts)
    for role, text in (("User", user), ("Assistant", assistant)):
        if not text:
            raise _field_error(f"the {role} part is empty")
        problem = storable_problem(text)
        if problem is not None:
            raise _field_error(f"the {role} part {problem}")
    return user, assistant


def _optional_timestamp(value: object) -> datetime | None:
    return None if value is None else timestamp_of(value)


# Parsing large histories goes through these, so pydantic checks the type itself (strict: no
# coercion, a number is not text) and only what it cannot check runs as Python.

# A valid user id (core.types), given as a string; an explicit null is refused (default None: not given).
UserId = Annotated[str | None, PlainValidator(_checked(_user_id))]
# One side of an exchange: a string, stripped, not empty, storable as text.
MessageText = Annotated[str, Strict(), AfterValidator(_message_text)]
# A whole exchange in 'User: …\nAssistant: …' form, as its two stripped parts.
ExchangeParts = Annotated[tuple[str, str], PlainValidator(_exchange_parts)]
# An ISO-8601 date or datetime string as a UTC datetime (naive: taken as UTC); null is none.
OptionalTimestamp = Annotated[datetime | None, PlainValidator(_checked(_optional_timestamp))]
# The same, required.
Timestamp = Annotated[datetime, PlainValidator(_checked(timestamp_of))]


def validation_reason(error: ValidationError) -> str:
    """A validation error as a reject's one-line reason, naming the field: ``assistant: field required``."""
    first = error.errors(include_url=False, include_context=False)[0]
    field = ".".join(str(part) for part in first["loc"])
    if first["type"] == "missing":
        message = "field required"
    elif first["type"] == "string_type":  # pydantic's own check (strict str): worded as the others are
        message = f"must be a string, got {json_kind(first['input'])}"
    else:
        message = first["msg"]
    return f"{field}: {message}" if field else message
