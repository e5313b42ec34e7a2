"""Request and response bodies of the HTTP API (they are the OpenAPI schema).

Requests forbid unknown fields, so a misspelt field is a 422 naming it rather than silently
ignored; text fields refuse NUL characters, which PostgreSQL cannot store.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from yak_pipeline.core.exchanges import MAX_RECALL_QUERY_CHARS, MAX_TURN_MESSAGE_CHARS
from yak_pipeline.core.types import USER_ID_PATTERN, MemoryType, Tier
from yak_pipeline.ingestion.records import EARLIEST_EXCHANGE_DATE, FUTURE_TOLERANCE


def _storable(text: str) -> str:
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    return text


def _storable_or_none(text: str | None) -> str | None:
    return None if text is None else _storable(text)


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
Text = Annotated[str, Field(min_length=1), AfterValidator(_storable), AfterValidator(_not_blank)]
ExchangeTime = Annotated[AwareDatetime, AfterValidator(_plausible_exchange_time),
                        Field(description="When the exchange happened, with a time zone; default now.")]


class RequestBody(BaseModel):
    """Base of request bodies: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


# --- memories -------------------------------------------------------------------------------

class MemoryCreate(RequestBody):
    """One exchange to remember, "User: …\\nAssistant: …" or any text."""

    content: Annotated[Text, Field(max_length=200_000)]
    user_id: UserId
    occurred_at: ExchangeTime | None = None


class MemoryOut(BaseModel):
    """A stored raw memory."""

    id: UUID
    content: str
    user_id: str
    created_at: datetime
    occurred_at: datetime
    status: str
    source: str


_MEMORY_TYPE_HELP = ("What kind of thing it says: instruction (how the user wants to be answered), preference, "
                     "fact, or event (something that happened or will, on event_on).")
_EVENT_ON_HELP = "An event's day, resolved against when it was said; null for other types or an undated event."


class DistillationSummary(BaseModel):
    """A distillation as listed under its memory."""

    id: UUID
    content: str
    confidence: float
    tier: str
    warmth: float
    status: str
    needs_review: bool
    memory_type: MemoryType = Field(default="fact", description=_MEMORY_TYPE_HELP)
    event_on: date | None = Field(default=None, description=_EVENT_ON_HELP)


class MemoryDetail(MemoryOut):
    """A memory with its processing state and its distillations."""

    attempts: int
    last_error: str | None
    distillations: list[DistillationSummary]


class MemoryPage(BaseModel):
    """One page of memories; ``next_offset`` is null on the last page."""

    items: list[MemoryOut]
    limit: int
    offset: int
    next_offset: int | None


# --- recall ---------------------------------------------------------------------------------

class SearchRequest(RequestBody):
    """A recall query for one user."""

    query: Annotated[Text, Field(max_length=MAX_RECALL_QUERY_CHARS)]
    user_id: UserId
    limit: int = Field(default=5, ge=1, le=100)
    threshold: float = Field(default=0.7, ge=0.0, le=1.0,
                             description="Relevance threshold t of DESIGN §4, on the calibrated relevance (docs/RECALL.md).")
    as_of: AwareDatetime | None = Field(
        default=None, description="Recall as of this moment: only what had happened by then, aged from then.")
    explain: bool = Field(default=False, description="Give each hit its score breakdown.")


class SearchHit(BaseModel):
    """One recalled memory, ranked by ``score``: a distillation, or what the user said (``kind`` raw)."""

    id: UUID
    kind: Literal["distilled", "raw"] = Field(
        default="distilled", description="distilled: a distillation (id is its id); raw: an exchange no active "
                                         "distillation holds, recalled as the user's own words (id is the memory's).")
    memory_id: UUID
    content: str = Field(description="The distillation, or for a raw hit what the user said.")
    reply: str | None = Field(default=None, description="A raw hit's assistant reply: context, not a fact about the user.")
    confidence: float | None = Field(description="The distiller's confidence; null for a raw hit.")
    tier: str
    memory_type: MemoryType | None = Field(default=None, description=_MEMORY_TYPE_HELP + " Null for a raw hit "
                                                                                        "(not distilled, so not typed).")
    event_on: date | None = Field(default=None, description=_EVENT_ON_HELP)
    warmth: float
    similarity: float = Field(description="The best raw cosine of the query to the memory or its exchange.")
    relevance: float = Field(description="Calibrated relevance in [0, 1] that the gate applies to.")
    score: float = Field(description="The recall order on the relevance scale, in [0, 1]: the relevance with "
                                     "recency, warmth and weight folded in (higher first).")
    rank_odds: float = Field(description="What recall orders by internally: odds(standing)^e × decay × "
                                         "(1 + warmth) × gravity (spans many orders of magnitude).")
    is_core: bool
    occurred_at: datetime
    superseded_by: UUID | None = Field(default=None, description="The newer memory that replaced this one.")
    in_conflict: bool = False
    explain: dict[str, Any] | None = Field(
        default=None, description="With explain: why in plain words, relevance and its legs, decay, warmth "
                                  "factor, gravity.")


class ContextRequest(SearchRequest):
    """A recall query whose memories are rendered as the prompt's memory block."""

    system_prompt: Annotated[str, Field(default="", max_length=100_000), AfterValidator(_storable)]


class ContextOut(BaseModel):
    """The memory block (empty when nothing was recalled), the ids in it, and the prompt messages."""

    block: str
    recalled_ids: list[UUID]
    profile_ids: list[UUID] = Field(default_factory=list, description="The profile lines the block carries "
                                                                      "(GET /api/profile), apart from the recalled memories.")
    messages: list[dict[str, str]]
    recall_error: str | None
    note: str | None = Field(default=None, description="Why the block is empty when the user has no memories "
                                                       "at all (a new user, or a mistyped user id).")


# --- the profile ----------------------------------------------------------------------------

class ProfileLineOut(BaseModel):
    """One of the user's standing instructions or preferences, as they said it."""

    id: UUID
    memory_id: UUID = Field(description="The exchange it was said in (forgetting that memory removes the line).")
    kind: Literal["instruction", "preference"]
    text: str
    said_at: datetime
    dropped: bool = Field(description="The user took it out of the profile; the exchange stays a memory.")
    sent: bool | None = Field(default=None, description="Whether every block carries it now.")
    why_not_sent: str | None = None


class ProfileOut(BaseModel):
    """What every memory block of the user carries (``sent``, in order) and every profile line."""

    token_budget: int = Field(description="YAK_PROFILE_TOKENS: the profile part's budget (0: off).")
    sent: list[ProfileLineOut]
    lines: list[ProfileLineOut]


class ProfileDrop(RequestBody):
    """Take lines out of the user's profile (or, with ``keep``, put them back)."""

    user_id: UserId
    ids: list[UUID] = Field(min_length=1, max_length=200)
    keep: bool = Field(default=False, description="Put the lines back into the profile instead.")


class ProfileDropOut(BaseModel):
    """The lines whose status changed."""

    changed: list[UUID]


# --- turns and warmth -----------------------------------------------------------------------

class TurnCreate(RequestBody):
    """One finished turn: stored as a memory and queued for per-turn warmth evaluation."""

    user_id: UserId
    user_message: Annotated[Text, Field(max_length=MAX_TURN_MESSAGE_CHARS)]
    assistant_message: Annotated[Text, Field(max_length=MAX_TURN_MESSAGE_CHARS)]
    recalled_ids: list[UUID] = Field(default_factory=list, max_length=200)
    occurred_at: ExchangeTime | None = None


class TurnAccepted(BaseModel):
    """The queued turn and the memory its exchange was stored as; ``queued`` false for a repeat."""

    turn_id: UUID
    memory_id: UUID
    queued: bool
    new_user: bool = Field(default=False, description="This turn is the user's first memory: the user id was "
                                                      "new to Yak (there is no user registry; check for a typo).")


class WarmthEvaluate(RequestBody):
    """Evaluate now how useful a recalled memory (a distillation id) was for ``context``."""

    memory_id: UUID
    context: Annotated[Text, Field(max_length=200_000)]
    evaluator: Annotated[str | None, Field(default=None, max_length=100)] = None


class WarmthEvaluation(BaseModel):
    """The evaluator's relevance score and the warmth change it caused."""

    memory_id: UUID
    relevance_score: float
    warmth_change: float
    new_warmth: float


class WarmthEvent(BaseModel):
    """One recorded warmth change."""

    relevance_score: float | None
    delta: float
    warmth_before: float
    warmth_after: float
    reason: str
    evaluator: str | None
    turn_id: UUID | None
    created_at: datetime


class WarmthOut(BaseModel):
    """A distillation's warmth and its latest changes, newest first."""

    memory_id: UUID
    warmth: float
    history: list[WarmthEvent]


class BulkWarmthReset(RequestBody):
    """Reset warmth to 0.5 for a user's distillations (all, or those listed)."""

    user_id: UserId
    memory_ids: list[UUID] | None = Field(default=None, max_length=10_000)


class WarmthResetOut(BaseModel):
    """How many distillations changed."""

    reset: int


# --- distillations --------------------------------------------------------------------------

class DistillationOut(BaseModel):
    """A distillation's live state."""

    id: UUID
    memory_id: UUID
    user_id: str
    content: str
    confidence: float
    tier: str
    warmth: float
    user_weight: float
    status: str
    needs_review: bool
    embedding_model: str | None
    prompt_version: str
    created_at: datetime
    updated_at: datetime
    memory_type: MemoryType = Field(default="fact", description=_MEMORY_TYPE_HELP)
    event_on: date | None = Field(default=None, description=_EVENT_ON_HELP)
    superseded_by: UUID | None = Field(default=None, description=(
        "The newer distillation that replaced this one (a knowledge update): still recallable, ranked "
        "below it, and not counted among the active memories MEMORY.md lists."))


class VersionOut(BaseModel):
    """One version of a distillation's text."""

    version: int
    content: str
    reason: str
    merged_from: list[UUID]
    embedding_model: str | None
    prompt_version: str | None
    created_at: datetime


class DistillationDetail(DistillationOut):
    """A distillation with every version, oldest first."""

    versions: list[VersionOut]


class DistillationPage(BaseModel):
    """One page of distillations."""

    items: list[DistillationOut]
    limit: int
    offset: int
    next_offset: int | None


class ManualVersion(RequestBody):
    """New text for a distillation, written by a person; the old text stays as a version."""

    content: Annotated[Text, Field(max_length=4_000)]


class WeightUpdate(RequestBody):
    """A person's weight for a distillation (pin): a factor of recall's gravity; 1 is neutral."""

    user_weight: Annotated[float, Field(gt=0, le=10, description="Above 0, at most 10; e.g. 2 to pin, 1 to unpin.")]


class TierUpdate(RequestBody):
    """A person's importance tier for a distillation: recall's tier multiplier and relevance gate."""

    tier: Annotated[Tier, Field(description="core (weighs 2×, a looser gate), medium (1×) or low (0.5×, a stricter gate).")]


class TypeUpdate(RequestBody):
    """A person's type for a distillation (it does not change recall's ranking)."""

    memory_type: Annotated[MemoryType, Field(description="instruction, preference, fact or event (an event is dated "
                                                         "from its exchange's words).")]


class MergeRequest(RequestBody):
    """Merge ``merge_id`` into ``keep_id``: ``keep_id`` gets a version, ``merge_id`` becomes ``merged``."""

    keep_id: UUID
    merge_id: UUID
    content: Annotated[Text | None, Field(default=None, max_length=4_000,
                                          description="The merged text; default: the LLM consolidates both.")] = None


# --- review and conflicts -------------------------------------------------------------------

class ReviewItem(BaseModel):
    """A distillation waiting for a person's decision."""

    id: UUID
    memory_id: UUID
    user_id: str
    content: str
    confidence: float
    tier: str
    warmth: float
    status: str
    needs_review: bool
    in_conflict: bool
    created_at: datetime
    memory_type: MemoryType = Field(default="fact", description=_MEMORY_TYPE_HELP)
    event_on: date | None = Field(default=None, description=_EVENT_ON_HELP)


class ReviewDecision(BaseModel):
    """The outcome of approving or rejecting."""

    id: UUID
    decision: Literal["approved", "rejected"]


class ConflictOut(BaseModel):
    """Two of a user's distillations that contradict each other."""

    id: UUID
    user_id: str
    distillation_a: UUID
    content_a: str
    distillation_b: UUID
    content_b: str
    score: float
    status: str
    resolution: str | None
    created_at: datetime
    resolved_at: datetime | None
    said_a: datetime | None = Field(default=None, description="When side a was said (its exchange's time).")
    said_b: datetime | None = Field(default=None, description="When side b was said (its exchange's time).")


class ConflictClose(RequestBody):
    """An optional note on how the conflict was settled."""

    resolution: Annotated[str | None, Field(default=None, max_length=1_000), AfterValidator(_storable_or_none)] = None


class ConflictKeep(RequestBody):
    """Which side of a conflict to keep: ``a`` or ``b`` (the other is rejected) or ``both``."""

    keep: Literal["a", "b", "both"]
    resolution: Annotated[str | None, Field(default=None, max_length=1_000), AfterValidator(_storable_or_none)] = None


class ConflictClosed(BaseModel):
    """The conflict's new status."""

    id: UUID
    status: Literal["resolved", "dismissed"]


# --- forget ---------------------------------------------------------------------------------

class ForgetRequest(RequestBody):
    """An explicit forget command (DESIGN §4): ``/forget <id>``, ``/forget <phrase>``,
    ``forget this memory`` (with ``context_memory_id``) or ``delete memory: <id>``."""

    command: Annotated[Text, Field(max_length=2_000)]
    user_id: UserId
    context_memory_id: Annotated[str | None, Field(default=None, max_length=64)] = None
    soft: bool = Field(default=False, description="Keep the rows but hide them from every read path.")


class ForgetConfirm(RequestBody):
    """Confirm a forget by phrase with the token it returned."""

    token: Annotated[str, Field(min_length=16, max_length=200)]
    user_id: UserId
    soft: bool = False


class ForgetCandidate(BaseModel):
    """A memory that contains the phrase."""

    memory_id: UUID
    occurred_at: datetime
    content: str
    distillations: list[str]


class ForgetResult(BaseModel):
    """``deleted``: these rows are gone. ``confirm``: candidates to confirm with the token.
    ``nothing``: the phrase matched no memory."""

    action: Literal["deleted", "confirm", "nothing"]
    deleted_memory_ids: list[UUID] = Field(default_factory=list)
    deleted_distillation_ids: list[UUID] = Field(default_factory=list)
    not_found: list[str] = Field(default_factory=list)
    candidates: list[ForgetCandidate] = Field(default_factory=list)
    confirmation_token: str | None = None
    expires_at: datetime | None = None


# --- operations -----------------------------------------------------------------------------

class ComponentHealth(BaseModel):
    """Whether one dependency answered, and a short note."""

    ok: bool
    detail: str


class HealthOut(BaseModel):
    """``ok`` when every dependency answered, else ``degraded``."""

    status: Literal["ok", "degraded"]
    database: ComponentHealth
    embedder: ComponentHealth
    llm: ComponentHealth


class FailedItem(BaseModel):
    """A memory or turn whose processing failed (retrying, or given up)."""

    kind: Literal["memory", "turn"]
    id: UUID
    user_id: str
    status: str
    attempts: int
    last_error: str | None
    created_at: datetime


class QuarantinedItem(BaseModel):
    """A file in the drop folder's ``failed/``: a whole file Yak could not read (``file``), or the
    rejected records of an otherwise good file (``records``), with the reasons from its error file."""

    name: str
    kind: Literal["file", "records"]
    records: int
    reasons: list[str]
    quarantined_at: datetime


class QuarantineOut(BaseModel):
    """The drop folder's quarantine: counts, and the latest entries (newest first)."""

    folder: str
    files: int = Field(description="Whole files that could not be read.")
    records: int = Field(description="Rejected records kept from otherwise good files.")
    items: list[QuarantinedItem]


class QueueOut(BaseModel):
    """What waits for the pipeline, and what failed."""

    pending_memories: int
    pending_turns: int
    failed_memories: int
    failed_turns: int
    unembedded_memories: int = Field(
        default=0, description="Memories still without their vectors (recallable by their words meanwhile): "
                               "an import's are made in the background after `yak import` returns.")
    failed: list[FailedItem]
    quarantine: QuarantineOut | None = Field(
        default=None, description="What the drop folder refused, with reasons (admin keys only: a file can hold "
                                  "several users' records; not filtered by user_id).")


class KeyCreate(RequestBody):
    """A new key: scoped to ``user_id``, or ``admin``."""

    user_id: UserId | None = None
    admin: bool = False
    label: Annotated[str | None, Field(default=None, max_length=200)] = None
    read_only: bool = Field(default=False, description="The key may recall and search, never write or forget.")

    @model_validator(mode="after")
    def _one_kind(self) -> KeyCreate:
        if self.admin == (self.user_id is not None):
            raise ValueError("give either user_id or admin=true")
        return self


class KeyOut(BaseModel):
    """A stored key (the key itself is never shown again)."""

    id: UUID
    prefix: str
    user_id: str | None
    admin: bool
    label: str | None
    created_at: datetime
    revoked_at: datetime | None
    read_only: bool = False


class KeyCreated(KeyOut):
    """A new key, shown this once."""

    key: str


def rows_to(model: type[BaseModel], rows: list[dict[str, Any]]) -> list[Any]:
    """Validate store rows into response models."""
    return [model.model_validate(row) for row in rows]
