"""The CLI's quick read of the settings (no pydantic) agrees with :class:`Settings`, or leaves it to it.

A command that only talks to a running server reads ``YAK_HOME``, ``YAK_API_URL`` and
``YAK_ADMIN_API_KEY`` without importing pydantic, and checks the other ``YAK_*`` values against
``yak_pipeline.cli.config.CHECKS``. Two things must hold: the table is the model's (a field added
to Settings is added there), and a value the quick check calls valid is one pydantic accepts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import annotated_types
import pytest

from yak_pipeline.cli.config import CHECKS, ClientSettings, quick_client_settings, surely_valid
from yak_pipeline.cli.parts import CliParts
from yak_pipeline.settings import Settings, SettingsError, get_settings, load_settings

# Validators that narrow a text field, and the check that stands for each in CHECKS.
VALIDATOR_CHECKS = {"_known_timezone": ("timezone",)}
SAMPLES = ["", " ", "0", "1", "-1", "5", "05", "-0", "+3", "5_0", "1e3", "0.5", "1.0", "2.5", "-0.5", "10", "11",
           "64", "65", "100", "100.5", "1000", "16000", "16001", "32768", "100000", "99999999999999999999",
           "true", "True", "TRUE", "false", "yes", "off", "t", "F", "maybe", "nan", "inf",
           "UTC", "Europe/Berlin", "Mars/Olympus", "../etc", "local", "openai", "hashing", "Local",
           "auto", "json_schema", "json_object_schema", "json_object", "redact", "refuse", "x" * 300]


def _check_from_model(name: str) -> tuple:
    """The check a field needs, read off the pydantic model: what CHECKS must say for it."""
    field = Settings.model_fields[name]
    annotation = field.annotation
    if typing.get_origin(annotation) in (typing.Union, type(int | None)):
        (annotation,) = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    validators = [v for v, d in Settings.__pydantic_decorators__.field_validators.items()
                  if name in d.info.fields and v != "_blank_is_unset"]
    if validators:
        assert len(validators) == 1 and validators[0] in VALIDATOR_CHECKS, f"teach CHECKS about {validators}"
        return VALIDATOR_CHECKS[validators[0]]
    if typing.get_origin(annotation) is typing.Literal:
        return ("choice", *typing.get_args(annotation))
    if annotation in (int, float):
        bounds = {"gt": None, "ge": None, "le": None}
        for constraint in field.metadata:
            kind = {annotated_types.Gt: "gt", annotated_types.Ge: "ge", annotated_types.Le: "le"}[type(constraint)]
            bounds[kind] = getattr(constraint, kind)
        return (annotation.__name__, bounds["gt"], bounds["ge"], bounds["le"])
    if annotation is bool:
        return ("bool",)
    assert annotation.__name__ in ("str", "Path", "SecretStr"), f"teach CHECKS about {annotation}"
    assert not field.metadata
    return ("text",)


def test_the_checks_are_the_models_fields_types_and_bounds() -> None:
    assert CHECKS == {name: _check_from_model(name) for name in Settings.model_fields}


@pytest.mark.parametrize("name", list(CHECKS))
def test_a_value_the_quick_check_accepts_pydantic_accepts(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    accepted = 0
    for value in SAMPLES:
        if not surely_valid(CHECKS[name], value):
            continue
        accepted += 1
        monkeypatch.setenv(f"YAK_{name.upper()}", value)
        load_settings()  # raises SettingsError if the quick check was wrong
    assert accepted  # every field has values the quick check is sure of


@pytest.mark.parametrize(("variable", "value"), [
    ("YAK_LLM_MAX_RETRIES", "abc"), ("YAK_LLM_MAX_RETRIES", "11"), ("YAK_HALF_LIFE_DAYS", "0"),
    ("YAK_EMBEDDER", "Local"), ("YAK_TIMEZONE", "Mars/Olympus"), ("YAK_DECAY_ENABLED", "maybe"),
    ("YAK_EMBED_DIMENSIONS", ""),
])
def test_a_bad_value_is_left_to_pydantic(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    assert quick_client_settings() is None
    with pytest.raises(SettingsError, match=variable):
        load_settings()


def test_a_value_pydantic_takes_but_the_quick_check_is_not_sure_of_is_read_by_pydantic(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("YAK_HOME", str(tmp_path))
    monkeypatch.setenv("YAK_LLM_MAX_RETRIES", " 5")  # pydantic strips the space
    monkeypatch.setenv("YAK_ADMIN_API_KEY", "k-123")
    assert quick_client_settings() is None
    get_settings.cache_clear()
    try:
        assert CliParts.start(get_settings).client == ClientSettings(home=tmp_path, api_url=None, admin_api_key="k-123")
    finally:
        get_settings.cache_clear()


def test_a_name_in_lower_case_is_left_to_pydantic_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("yak_api_url", "http://127.0.0.1:9")
    assert quick_client_settings() is None
    assert load_settings().api_url == "http://127.0.0.1:9"


@pytest.mark.parametrize("environ", [
    {},
    {"YAK_HOME": "/srv/yak", "YAK_API_URL": "http://127.0.0.1:8000", "YAK_ADMIN_API_KEY": "secret"},
    {"YAK_HOME": "", "YAK_API_URL": "", "YAK_ADMIN_API_KEY": ""},
    {"YAK_HOME": "relative/home", "YAK_EMBEDDER": "hashing", "YAK_TIMEZONE": "Europe/Berlin",
     "YAK_RECALL_LLM_JUDGE": "true", "YAK_LLM_TIMEOUT_SECONDS": "2.5", "YAK_API_KEY": "not a setting",
     "YAK_NOT_A_SETTING": "whatever"},
])
def test_the_quick_read_is_what_pydantic_reads(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> None:
    for key in [k for k in os.environ if k.upper().startswith("YAK_")]:
        monkeypatch.delenv(key)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    key = settings.admin_api_key
    assert quick_client_settings() == ClientSettings(
        home=settings.home, api_url=settings.api_url, admin_api_key=None if key is None else key.get_secret_value())


def test_a_command_against_a_server_imports_no_pydantic_settings(tmp_path: Path) -> None:
    # `yak --help` and a command's own start: the settings' pydantic is imported by the commands
    # that read the full settings, not by every command (bench/cli_latency.py).
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("YAK_")}
    env["YAK_HOME"] = str(tmp_path)
    code = ("import json, sys\nfrom yak_pipeline.cli.main import main\nsys.argv = ['yak', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in ('pydantic_settings', 'yak_pipeline.settings', 'http.client', "
            "'asyncio') if m in sys.modules)), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []


def test_a_bad_value_still_fails_every_command_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("YAK_")}
    env.update(YAK_HOME=str(tmp_path), YAK_LLM_MAX_RETRIES="abc")
    done = subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "queue", "status", "--json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == ("error: YAK_LLM_MAX_RETRIES: Input should be a valid integer, unable to parse string "
                           "as an integer\n")
