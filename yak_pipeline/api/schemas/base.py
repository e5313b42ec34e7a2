"""What every request and response body shares: the request base, the field types, ``rows_to``.

Requests forbid unknown fields, so a misspelt field is a 422 naming it rather than silently
ignored; text fields refuse NUL characters, which PostgreSQL cannot store.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints

from yak_pipeline.core.types import USER_ID_PATTERN
from yak_pipeline.ingestion.records import EARLIEST_EXCHANGE_DATE, FUTURE_TOLERANCE


def storable(text: str) -> str:
    """``text``, refused when it holds a NUL character (PostgreSQL cannot store one)."""
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    return text


def storable_or_none(text: str | None) -> str | None:
    """:func:`storable` for an optional text."""
    return None if text is None else storable(text)


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be blank")
    return text


def _plausible_exchange_time(when: datetime) -> datetime:
    """The date limits file ingestion applies: not before 2000, not more than a day ahead."""
    if when.date() < EARLIEST_EXCHANGE_DATE:
        raise ValueError(f"is before {EARLIEST_EXCHANGE_DATE}")
    if when > datetime.now(UTC) + FUTURE_TOLERANCE:
        raise ValueError("is in the future")
    return when


UserId = Annotated[str, StringConstraints(pattern=USER_ID_PATTERN),
                   Field(description="1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit.")]
Text = Annotated[str, Field(min_length=1), AfterValidator(storable), AfterValidator(_not_blank)]
ExchangeTime = Annotated[AwareDatetime, AfterValidator(_plausible_exchange_time),
                        Field(description="When the exchange happened, with a time zone; default now.")]
MEMORY_TYPE_HELP = ("What kind of thing it says: instruction (how the user wants to be answered), preference, "
                    "fact, or event (something that happened or will, on event_on).")
EVENT_ON_HELP = "An event's day, resolved against when it was said; null for other types or an undated event."


class RequestBody(BaseModel):
    """Base of request bodies: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


def rows_to(model: type[BaseModel], rows: list[dict[str, Any]]) -> list[Any]:
    """Validate store rows into response models."""
    return [model.model_validate(row) for row in rows]
