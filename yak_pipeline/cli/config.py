"""The settings as a ``yak`` command reads them: the full ones only when it needs them.

Importing :mod:`yak_pipeline.settings` imports pydantic and pydantic-settings, about 0.15 s of
a command that, against a running server, takes 0.35 s in all (bench/cli_latency.py). A command
that only talks to a server needs three of the settings — ``YAK_HOME`` (where ``yak serve``
recorded itself and its key), ``YAK_API_URL`` and ``YAK_ADMIN_API_KEY`` — and no pydantic to
read them. So:

- the full settings are read by the root callback (:mod:`.parts`) when a command first asks for
  them: the commands that open the database or run the pipeline.
- :func:`quick_client_settings` reads those three from the environment without pydantic, when
  every ``YAK_*`` variable set is one pydantic surely accepts (:data:`CHECKS` knows each field's
  type and bounds; a test holds it to :class:`yak_pipeline.settings.Settings`). Anything it is not
  sure of — an unknown value, a bound crossed, a variable spelled in lower case — is left to
  pydantic, so a bad value still fails with pydantic's own one-line message.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PREFIX: Final = "YAK_"
DEFAULT_HOME: Final = "./.yak"  # Settings.home's default

# How pydantic validates each field from an environment string: ("text",) accepts any string
# (str, Path, SecretStr); ("int" | "float", gt, ge, le) a number within the bounds (None: no
# bound); ("choice", *values) one of the Literal's values; ("bool",) and ("timezone",) as named.
CHECKS: Final[dict[str, tuple]] = {
    "home": ("text",),
    "database_url": ("text",),
    "llm_base_url": ("text",),
    "llm_model": ("text",),
    "llm_api_key": ("text",),
    "llm_timeout_seconds": ("float", 0, None, None),
    "llm_max_retries": ("int", None, 0, 10),
    "llm_concurrency": ("int", None, 1, 64),
    "llm_structured_output": ("choice", "auto", "json_schema", "json_object_schema", "json_object"),
    "llm_max_tokens": ("int", None, 1, 32768),
    "embedder": ("choice", "local", "openai", "hashing"),
    "embed_model": ("text",),
    "embed_base_url": ("text",),
    "embed_dimensions": ("int", None, 8, 16000),
    "half_life_days": ("float", 0, None, None),
    "decay_enabled": ("bool",),
    "core_threshold_multiplier": ("float", None, 1.0, 10.0),
    "error_webhook": ("text",),
    "critical_webhook": ("text",),
    "alert_dedup_seconds": ("int", None, 0, None),
    "admin_api_key": ("text",),
    "api_url": ("text",),
    "drop_dir": ("text",),
    "timezone": ("timezone",),
    "prompt_version": ("text",),
    "recall_relevance_exponent": ("float", None, 0.5, 100),
    "recall_superseded_factor": ("float", None, 0, 1),
    "recall_exchange_context": ("bool",),
    "recall_raw_exchanges": ("bool",),
    "recall_block_odds_gap": ("float", None, 0, 100),
    "recall_block_tokens": ("int", None, 0, 100000),
    "recall_gather_limit": ("int", None, 0, 100),
    "profile_tokens": ("int", None, 0, 100000),
    "recall_query_parts": ("bool",),
    "recall_present_newest_first": ("bool",),
    "recall_llm_judge": ("bool",),
    "recall_llm_judge_keep": ("float", None, 0, 1),
    "recall_leg_size": ("int", None, 1, 1000),
    "upstream_base_url": ("text",),
    "upstream_api_key": ("text",),
    "upstream_anthropic_base_url": ("text",),
    "upstream_anthropic_api_key": ("text",),
    "upstream_timeout_seconds": ("float", 0, None, None),
    "proxy_recall_threshold": ("float", None, 0, 1),
    "proxy_recall_limit": ("int", None, 0, 50),
    "proxy_follow_up_words": ("int", None, 0, 200),
    "proxy_show_block": ("bool",),
    "secrets": ("choice", "redact", "refuse"),
    "access_log": ("bool",),
    "dagster_ui_url": ("text",),
    "dagster_pg_url": ("text",),
}

# Narrower than what pydantic takes (it also strips spaces, reads "5_0" and "1e3"): what these
# accept, pydantic accepts too; the rest goes to pydantic to judge.
_INTEGER: Final = re.compile(r"0|-?[1-9][0-9]{0,17}")
_DECIMAL: Final = re.compile(r"-?[0-9]{1,18}(\.[0-9]{1,18})?")
_BOOLEANS: Final = frozenset({"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"})


def _within(number: float, gt: float | None, ge: float | None, le: float | None) -> bool:
    return (gt is None or number > gt) and (ge is None or number >= ge) and (le is None or number <= le)


def surely_valid(check: tuple, value: str) -> bool:
    """Whether pydantic surely accepts ``value`` for a field checked as ``check`` (False: ask it)."""
    kind = check[0]
    if kind == "text":
        return True
    if kind == "choice":
        return value in check[1:]
    if kind == "bool":
        return value.lower() in _BOOLEANS
    if kind == "int":
        return _INTEGER.fullmatch(value) is not None and _within(int(value), *check[1:])
    if kind == "float":
        return _DECIMAL.fullmatch(value) is not None and _within(float(value), *check[1:])
    if kind == "timezone":
        from zoneinfo import ZoneInfo

        try:
            ZoneInfo(value)
        except Exception:  # noqa: BLE001 - not found, not a key, a name too long for a file: pydantic says
            return False
        return True
    return False


@dataclass(frozen=True)
class ClientSettings:
    """What a command needs to find and talk to a running server."""

    home: Path
    api_url: str | None
    admin_api_key: str | None


def quick_client_settings(environ: Mapping[str, str] | None = None) -> ClientSettings | None:
    """The client's settings read without pydantic, or None when pydantic has to judge ``environ``.

    None when a ``YAK_*`` variable naming a setting holds a value :func:`surely_valid` is not
    sure of, or is spelled in other than capitals (pydantic-settings reads names in any case,
    and which of two spellings wins is its business).
    """
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for key, value in environ.items():
        if key[:4].upper() != PREFIX:
            continue
        name = key[4:].lower()
        check = CHECKS.get(name)
        if check is None:
            continue  # not a setting (YAK_API_KEY, YAK_MODEL_CACHE): Settings ignores it too
        if key != key.upper() or not surely_valid(check, value):
            return None
        values[name] = value
    return ClientSettings(home=Path(values.get("home", DEFAULT_HOME)), api_url=values.get("api_url"),
                          admin_api_key=values.get("admin_api_key"))
