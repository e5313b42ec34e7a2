"""Every environment variable Yak reads, in one place, read once.

Each field's ``description`` is the one-line documentation the README table is generated
from (``yak settings --markdown``; a test checks the README against this class). Nothing
else in the project reads ``os.environ`` for Yak's own configuration.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# How the LLM provider asks for structured output (see yak_pipeline.llm.openai_client).
StructuredOutput = Literal["auto", "json_schema", "json_object_schema", "json_object"]


def _unset_secret(description: str) -> Any:  # noqa: ANN401 - what pydantic's Field returns
    """A secret setting, unset by default: pydantic hides its value in every dump and repr."""
    return Field(default=None, description=description)


# A token budget of a part of the memory block (0: none; 100,000 is far past any prompt).
TokenBudget = Annotated[int, Field(ge=0, le=100_000)]


class SettingsError(ValueError):
    """A configuration value is invalid; the message names the variable and the fix."""


class Settings(BaseSettings):
    """Yak's configuration, from ``YAK_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="YAK_", extra="ignore", frozen=True)

    home: Path = Field(
        default=Path("./.yak"),
        description="Folder for Yak's local state: embedded database, Dagster home, drop folder.",
    )
    database_url: str | None = Field(
        default=None,
        description="PostgreSQL 16+ URL with pgvector 0.8+; unset = embedded server under $YAK_HOME/pgdata.",
    )
    llm_base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible endpoint (e.g. http://127.0.0.1:11434/v1); unset = offline rules provider.",
    )
    llm_model: str = Field(default="gpt-4o-mini", description="Chat model name sent to the LLM endpoint.")
    llm_api_key: SecretStr | None = _unset_secret("API key for the LLM endpoint (never logged).")
    llm_timeout_seconds: float = Field(default=60.0, gt=0, description="Timeout of one LLM request, in seconds.")
    llm_max_retries: int = Field(
        default=3, ge=0, le=10, description="Retries of an LLM call on transport errors, 5xx and invalid output."
    )
    llm_concurrency: int = Field(default=4, ge=1, le=64, description="Concurrent LLM calls within one pipeline run.")
    llm_structured_output: StructuredOutput = Field(
        default="auto",
        description="How answers are held to their JSON schema: json_schema (OpenAI), json_object_schema (llama-cpp-python), json_object (JSON mode only), or auto (the first the server takes).",
    )
    llm_max_tokens: int = Field(
        default=400, ge=1, le=32768, description="Most tokens one LLM answer may take (a longer one is cut off: invalid, retried)."
    )
    embedder: Literal["local", "openai", "hashing"] = Field(
        default="local",
        description="Embedding provider: local (all-MiniLM-L6-v2, offline), openai (/v1/embeddings), hashing (feature hashing, for tests).",
    )
    embed_model: str | None = Field(
        default=None,
        description="Embedding model name for the openai embedder (e.g. nomic-embed-text); ignored by the others.",
    )
    embed_base_url: str | None = Field(
        default=None, description="Endpoint of the openai embedder; unset = $YAK_LLM_BASE_URL."
    )
    embed_dimensions: int | None = Field(
        default=None,
        ge=8,
        le=16000,
        description="Vector size of the openai embedder (asked of the endpoint when unset) or of the hashing one (default 384).",
    )
    half_life_days: float = Field(
        default=30.0, gt=0, description="Recall decay half-life in days."
    )
    decay_enabled: bool = Field(default=True, description="Apply recency decay in recall (true/false).")
    core_threshold_multiplier: float = Field(
        default=2.0, ge=1.0, le=10.0, description="How much wider the recall distance gate is for core memories."
    )
    error_webhook: SecretStr | None = _unset_secret("Discord-format webhook for error alerts (never logged).")
    critical_webhook: SecretStr | None = _unset_secret("Escalation webhook for critical alerts (never logged).")
    alert_dedup_seconds: int = Field(
        default=300, ge=0, description="Window within which alerts of one type are sent once."
    )
    admin_api_key: SecretStr | None = _unset_secret(
        "An admin API key accepted in addition to stored keys (never logged).")
    api_url: str | None = Field(
        default=None,
        description="A running `yak serve` the CLI sends its requests to; unset = the one `yak serve` recorded in $YAK_HOME.",
    )
    drop_dir: Path | None = Field(
        default=None, description="Drop folder watched for exchange files; unset = $YAK_HOME/drop."
    )
    timezone: str = Field(default="UTC", description="IANA time zone of the nightly schedules (02:00 and 03:00 local).")
    prompt_version: str = Field(
        default="v1", description="Distillation prompt version stored on each distillation; bump to backfill."
    )
    recall_relevance_exponent: float = Field(
        default=30.0, ge=0.5, le=100, description="Exponent on the odds of a memory's calibrated relevance in the recall score (odds^e × decay × (1 + warmth) × gravity): larger lets the query's evidence outweigh those priors."
    )
    recall_superseded_factor: float = Field(
        default=0.5, ge=0, le=1, description="Recall score factor of a memory that a newer one superseded (knowledge updates): below 1 ranks the current value first."
    )
    recall_exchange_context: bool = Field(
        default=True,
        description="Recall reads each exchange together with the exchanges just before and after it in the same conversation, by its words and by its meaning (true/false).",
    )
    recall_raw_exchanges: bool = Field(
        default=True,
        description="Recall an exchange that no active distillation holds (not distilled yet, in review, rejected, failed) as the user's own words; false recalls distillations only (true/false).",
    )
    recall_block_odds_gap: float = Field(
        default=2.0, ge=0, le=100,
        description="The memory block holds only the recalled memories whose odds are within this gap of the best one's (on the standing's logit scale: 1 is a factor of 2.7); large values keep every memory up to the limit.",
    )
    recall_block_tokens: TokenBudget = Field(
        default=600,
        description="Token budget of the memory block's lines (estimated at 4 characters a token; the first memory always goes in, cut to fit; 0: no budget).",
    )
    recall_gather_limit: int = Field(
        default=10, ge=0, le=100,
        description="Most memories in the block for a question that gathers (\"how many times …\", \"in what order …\", \"summarise …\"): every relevant one up to this, newest first, within the block's token budget (0: such questions get the usual block).",
    )
    profile_tokens: TokenBudget = Field(
        default=300,
        description="Token budget of the profile part of the memory block: the user's standing instructions and preferences, sent with every prompt (instructions first, newest first; 0: no profile).",
    )
    recall_query_parts: bool = Field(
        default=True,
        description="A question that lists things to weigh together (\"Considering A, B and C, …\", \"between A and B\") or gathers over several topics (\"… in my questions about A and B\") is also recalled for each of them, the rankings interleaved (true/false; docs/RECALL.md: BEAM's multi-session questions +5 points, cross-validated, the other files unchanged).",
    )
    recall_present_newest_first: bool = Field(
        default=True,
        description="A question about the present (\"where do I live now?\") gets its first five recalled memories newest first, so the current value leads the block (true/false).",
    )
    recall_llm_judge: bool = Field(
        default=False,
        description="With an LLM endpoint ($YAK_LLM_BASE_URL), the LLM also judges each memory recall found against the query and drops those it scores below $YAK_RECALL_LLM_JUDGE_KEEP (one LLM call per recalled memory; true/false).",
    )
    recall_llm_judge_keep: float = Field(
        default=0.5, ge=0, le=1, description="The LLM judge's score (0-1) a recalled memory needs to stay, when $YAK_RECALL_LLM_JUDGE is on."
    )
    recall_leg_size: int = Field(
        default=50, ge=1, le=1000, description="How many candidates each recall leg (BM25 and vectors, over distillations and exchanges) proposes for relevance scoring."
    )

    upstream_base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible endpoint the memory proxy (`/v1/chat/completions`) forwards chats to; unset = $YAK_LLM_BASE_URL (with its key).",
    )
    upstream_api_key: SecretStr | None = _unset_secret(
        "API key the memory proxy sends to $YAK_UPSTREAM_BASE_URL (never logged, never the client's Yak key).")
    upstream_anthropic_base_url: str = Field(
        default="https://api.anthropic.com",
        description="Anthropic Messages API endpoint (without /v1) the memory proxy's `/v1/messages` forwards to (Claude Code, Anthropic SDKs).",
    )
    upstream_anthropic_api_key: SecretStr | None = _unset_secret(
        "Anthropic API key the memory proxy sends to $YAK_UPSTREAM_ANTHROPIC_BASE_URL; unset = the client's own key "
        "(x-api-key or Authorization) goes upstream and the Yak key comes in X-Yak-Key (never logged).")
    upstream_timeout_seconds: float = Field(
        default=300.0, gt=0, description="How long the memory proxy waits for the upstream's next bytes, in seconds."
    )
    proxy_recall_threshold: float = Field(
        default=0.7, ge=0, le=1, description="Recall threshold t of the memory proxy (the gate of DESIGN §4, as in /api/context)."
    )
    proxy_recall_limit: int = Field(
        default=5, ge=0, le=50, description="Most memories the memory proxy puts in a prompt's block (0: recall nothing, still store turns)."
    )
    proxy_follow_up_words: int = Field(
        default=8, ge=0, le=200,
        description="A last user message of at most this many words (a follow-up such as 'and her birthday?') is also "
                    "recalled for read after the user's previous message; 0: only the last message.",
    )
    proxy_show_block: bool = Field(
        default=False,
        description="The memory proxy logs the memory block it injects into each chat (a debugging aid: the block holds private memories; true/false).",
    )
    secrets: Literal["redact", "refuse"] = Field(
        default="redact",
        description="What a write does with a secret in its text (API keys, tokens, private keys, passwords, card numbers, IBANs): redact replaces each with a typed placeholder such as [secret: api key]; refuse rejects the write with a one-line error.",
    )
    access_log: bool = Field(
        default=False,
        description="`yak serve` / `yak proxy` log one line per HTTP request (method, path without the query string, status); off by default: paths and queries can hold private text (true/false).",
    )
    dagster_ui_url: str = Field(
        default="http://127.0.0.1:3000",
        description="The Dagster UI the web page (/ui) links to for runs and lineage; `yak up` sets it to the one it starts.",
    )
    dagster_pg_url: SecretStr | None = _unset_secret(
        "SQLAlchemy URL of Dagster's storage (runs, events, schedules), read by dagster.yaml too; unset = `yak up` uses the `dagster` database on Yak's PostgreSQL (never shown).",
    )

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r} (use an IANA name such as Europe/Berlin)") from exc
        return value

    @field_validator("database_url", "llm_base_url", "embed_base_url", "embed_model", "upstream_base_url", "dagster_pg_url",
                     mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        # `export YAK_DATABASE_URL=` should mean "unset", not "connect to ''".
        return None if isinstance(value, str) and not value.strip() else value

    @property
    def resolved_drop_dir(self) -> Path:
        """The drop folder in use."""
        return self.drop_dir if self.drop_dir is not None else self.home / "drop"

    @property
    def resolved_upstream(self) -> tuple[str | None, SecretStr | None]:
        """The memory proxy's upstream URL and key: ``YAK_UPSTREAM_*``, else the LLM endpoint's.

        The keys are never mixed: the LLM key goes only to the LLM endpoint, so setting another
        upstream never sends it to a second host.
        """
        if self.upstream_base_url is not None:
            return self.upstream_base_url, self.upstream_api_key
        return self.llm_base_url, self.llm_api_key

    @property
    def pgdata_dir(self) -> Path:
        """Data folder of the embedded PostgreSQL server."""
        return self.home / "pgdata"


def load_settings() -> Settings:
    """Read the environment into :class:`Settings`, turning validation errors into one line.

    Raises :class:`SettingsError` naming the ``YAK_*`` variable at fault.
    """
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise SettingsError(f"YAK_{field.upper()}: {message}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()


def settings_table_markdown() -> str:
    """The README's table of environment variables, generated from :class:`Settings`."""
    lines = ["| Variable | Default | Description |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = "unset" if default is None else (str(default).lower() if isinstance(default, bool) else str(default))
        lines.append(f"| `YAK_{name.upper()}` | `{shown}` | {field.description} |")
    return "\n".join(lines)
