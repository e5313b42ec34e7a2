"""What the LLM must answer, validated strictly, and what providers hand back to callers.

The pydantic models describe the JSON objects the prompts ask for. Validation is strict on
purpose: a confidence of ``100`` or ``"high"``, a tier of ``"urgent"``, a type of ``"opinion"`` or a
five-sentence "distillation" is a malformed answer and is rejected with a one-line reason; nothing
is clamped, rounded or coerced into looking valid. The only normalisations are the harmless,
unambiguous ones: surrounding whitespace is stripped and a tier's or type's letter case is ignored
(``"Core"`` is ``core``).
Extra keys are ignored, because a model that adds ``"reasoning"`` beside a correct answer still
gave a correct answer.

The same models are the JSON schema a provider asks the server to hold its answer to
(:func:`response_schema`): the types, the [0, 1] range, the tier and memory type names, in the subset of JSON
Schema that OpenAI's strict structured outputs and llama.cpp's grammar converter both accept.
Validation still runs on every answer, since a server may ignore the schema or enforce only part
of it (llama.cpp's grammar does not bound numbers, nor count sentences).

:func:`parse_reply` turns the raw text of a reply into a model (accepting a JSON object wrapped in
Markdown code fences, as many local models write it), raising :class:`LLMOutputError` otherwise.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, ValidationInfo, WithJsonSchema

from yak_pipeline.core.memory_types import check_memory_type
from yak_pipeline.core.sentences import count_sentences
from yak_pipeline.core.types import MEMORY_TYPES, TIERS, MemoryType, Tier
from yak_pipeline.llm.errors import LLMOutputError, one_line

MAX_CONTENT_CHARS = 1000
MIN_SENTENCES = 1
MAX_SENTENCES = 4
# How much of a bad reply an error message quotes: enough to recognise it, short enough for a log line.
REPLY_SNIPPET_CHARS = 80

_JSON_TYPE_NAMES = {str: "string", bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}


def _json_type(value: object) -> str:
    """The JSON name of ``value``'s type, as a person reading the reply would call it."""
    if value is None:
        return "null"
    return _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def _describe(value: object) -> str:
    """A short, one-line description of a wrong value: its JSON type and a clipped repr."""
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:39] + "…"
    return f"{_json_type(value)} {shown}"


def check_content(value: object, field: str = "content") -> str:
    """Validate a memory text: a non-blank string of 1–4 sentences and at most 1000 characters.

    Returns the text with surrounding whitespace stripped; raises ``ValueError`` with a one-line reason.
    """
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, got {_describe(value)}")
    text = value.strip()
    if not text:
        raise ValueError(f"{field} is blank")
    if len(text) > MAX_CONTENT_CHARS:
        raise ValueError(f"{field} is {len(text)} characters long, more than {MAX_CONTENT_CHARS}")
    sentences = count_sentences(text)
    if not MIN_SENTENCES <= sentences <= MAX_SENTENCES:
        raise ValueError(f"{field} has {sentences} sentences, expected {MIN_SENTENCES} to {MAX_SENTENCES}")
    return text


def check_unit_interval(value: object, field: str) -> float:
    """Validate a JSON number in [0, 1]; booleans, strings, NaN and infinities are rejected.

    Returns it as a float, unchanged; raises ``ValueError`` with a one-line reason.
    """
    # bool is a subclass of int in Python, but `true` is not a number in the reply's JSON.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number in [0, 1], got {_describe(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float is certainly out of range
        raise ValueError(f"{field} {_describe(value).split(' ', 1)[1]} is outside [0, 1]") from None
    if not math.isfinite(number):
        raise ValueError(f"{field} {value} is not a finite number")
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{field} {value!r} is outside [0, 1]")
    return number


def check_tier(value: object) -> Tier:
    """Validate a tier name (``core``, ``medium`` or ``low``; letter case and spaces ignored)."""
    if not isinstance(value, str):
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {_describe(value)}")
    tier = value.strip().lower()
    if tier not in TIERS:
        raise ValueError(f"tier {value!r} is not one of {', '.join(TIERS)}")
    return tier  # narrowed to Tier by the check against TIERS just above


class _StrictOutput(BaseModel):
    """Shared configuration: strict types, immutable, extra keys ignored (see the module docstring)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


def _unit_interval(value: object, info: ValidationInfo) -> float:
    return check_unit_interval(value, info.field_name or "value")


# Each field type carries its own check and what it looks like in the response schema. The
# "plain" validators replace pydantic's own checks, so the reason is ours and nothing is coerced;
# pydantic cannot derive the schema from them (it would say "any value"), hence WithJsonSchema.
_MEMORY_TEXT_SCHEMA = {"type": "string", "description": f"{MIN_SENTENCES} to {MAX_SENTENCES} short factual sentences"}
_UNIT_INTERVAL_SCHEMA = {"type": "number", "minimum": 0, "maximum": 1}
MemoryText = Annotated[str, PlainValidator(check_content), WithJsonSchema(_MEMORY_TEXT_SCHEMA)]
UnitInterval = Annotated[float, PlainValidator(_unit_interval), WithJsonSchema(_UNIT_INTERVAL_SCHEMA)]
TierName = Annotated[Tier, PlainValidator(check_tier), WithJsonSchema({"type": "string", "enum": list(TIERS)})]
MemoryTypeName = Annotated[MemoryType, PlainValidator(check_memory_type),
                           WithJsonSchema({"type": "string", "enum": list(MEMORY_TYPES)})]


class DistillationOutput(_StrictOutput):
    """The distiller's answer: ``{"content": …, "confidence": …, "tier": …, "type": …}``."""

    content: MemoryText
    confidence: UnitInterval
    tier: TierName
    type: MemoryTypeName


class ConsolidationOutput(_StrictOutput):
    """The consolidator's answer: ``{"content": …}``, one merged text of 1–4 sentences."""

    content: MemoryText


class ScoreOutput(_StrictOutput):
    """A judge's answer (conflict or relevance): ``{"score": …}`` with the score in [0, 1]."""

    score: UnitInterval


def response_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of an output model, as a provider sends it with ``response_format``.

    Every property is required and no other is allowed (``additionalProperties: false``): what
    OpenAI's strict mode demands, and what keeps a grammar-constrained small model from adding
    keys. Titles are left out (noise in a grammar); descriptions stay (they guide the model).
    """
    schema = model.model_json_schema()
    properties = {name: {k: v for k, v in field.items() if k != "title"}
                  for name, field in schema["properties"].items()}
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


@dataclass(frozen=True, slots=True)
class LLMCallStats:
    """How one provider call went.

    ``latency_ms`` is the wall time the caller waited, retries and back-off included; token counts
    are summed over all attempts that reported usage (``None`` when the endpoint reported none);
    ``attempts`` counts requests made (1 when the first one succeeded); ``invalid_outputs`` counts
    the attempts whose answer was rejected as invalid output (then retried); ``model`` is the
    model that answered, as the endpoint named it (``None`` when it did not say).
    """

    latency_ms: float
    prompt_tokens: int | None
    completion_tokens: int | None
    attempts: int
    model: str | None = None
    invalid_outputs: int = 0


@dataclass(frozen=True, slots=True)
class DistillationResult:
    """A validated distillation and the stats of the call that produced it.

    ``memory_type`` is what kind of thing it says (``core.memory_types``); an event's day is not
    the distiller's to say: it is resolved from the user's words when the distillation is stored.
    """

    content: str
    confidence: float
    tier: Tier
    stats: LLMCallStats
    memory_type: MemoryType = "fact"


@dataclass(frozen=True, slots=True)
class ConsolidationResult:
    """A validated consolidated text and the stats of the call that produced it."""

    content: str
    stats: LLMCallStats


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """A validated score in [0, 1] (conflict or relevance) and the stats of the call."""

    score: float
    stats: LLMCallStats


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming every defect pydantic found, e.g. ``missing field 'tier'; confidence 2 is outside [0, 1]``."""
    parts: list[str] = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(part) for part in error["loc"])
        if error["type"] == "missing":
            parts.append(f"missing field {location!r}")
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        # Our own messages already start with the field name; pydantic's generic ones do not.
        parts.append(message if not location or message.startswith(location) else f"{location}: {message}")
    return one_line("; ".join(parts) or "invalid output")


_FENCE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n?(?P<body>.*?)\n?[ \t]*```$", re.DOTALL)

M = TypeVar("M", bound=BaseModel)


def strip_code_fence(text: str) -> str:
    """The body of a reply wrapped in one Markdown code fence (```json … ```), else the text itself."""
    match = _FENCE.match(text.strip())
    return match.group("body").strip() if match else text.strip()


def _snippet(text: str) -> str:
    """The start of a reply, quoted on one line, for error messages."""
    flat = " ".join(text.split())
    return repr(flat[:REPLY_SNIPPET_CHARS] + ("…" if len(flat) > REPLY_SNIPPET_CHARS else ""))


def parse_reply(text: str | None, model: type[M]) -> M:
    """Parse the raw text of an LLM reply into ``model``.

    Accepts a JSON object, optionally inside Markdown code fences. Raises :class:`LLMOutputError`
    with a one-line reason when the reply is empty, not JSON, not an object, or fails validation.
    """
    if text is None or not text.strip():
        raise LLMOutputError("reply is empty")
    body = strip_code_fence(text)
    try:
        data: Any = json.loads(body)
    except json.JSONDecodeError as exc:
        raise LLMOutputError(f"reply is not JSON ({exc.msg} at char {exc.pos}): {_snippet(text)}") from None
    except RecursionError:  # absurdly nested arrays: not an answer, and not worth a stack trace
        raise LLMOutputError(f"reply is not usable JSON (nested too deeply): {_snippet(text)}") from None
    if not isinstance(data, dict):
        fields = ", ".join(model.model_fields)
        raise LLMOutputError(f"reply is a JSON {_json_type(data)}, expected an object with {fields}: {_snippet(body)}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise LLMOutputError(describe_validation_error(exc)) from None
