"""Settings: one class, documented in the README, bad values are one line naming the variable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from yak_pipeline.settings import Settings, SettingsError, load_settings, settings_table_markdown

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {
    "YAK_HOME", "YAK_DATABASE_URL", "YAK_LLM_BASE_URL", "YAK_LLM_MODEL", "YAK_LLM_API_KEY", "YAK_EMBEDDER",
    "YAK_EMBED_MODEL", "YAK_HALF_LIFE_DAYS", "YAK_DECAY_ENABLED", "YAK_CORE_THRESHOLD_MULTIPLIER",
    "YAK_ERROR_WEBHOOK", "YAK_ADMIN_API_KEY", "YAK_DROP_DIR", "YAK_TIMEZONE",
}


def test_every_required_variable_exists_with_a_description() -> None:
    names = {f"YAK_{name.upper()}" for name in Settings.model_fields}
    assert REQUIRED <= names
    assert all(field.description for field in Settings.model_fields.values())


def test_readme_lists_the_generated_settings_table() -> None:
    assert settings_table_markdown() in (ROOT / "README.md").read_text()


def test_defaults() -> None:
    settings = load_settings()
    assert settings.embedder == "local" and settings.database_url is None
    assert settings.resolved_drop_dir == settings.home / "drop"
    assert settings.half_life_days == 30.0 and settings.core_threshold_multiplier == 2.0


@pytest.mark.parametrize(
    ("variable", "value"),
    [("YAK_EMBEDDER", "word2vec"), ("YAK_TIMEZONE", "Mars/Olympus"), ("YAK_HALF_LIFE_DAYS", "-3"),
     ("YAK_DECAY_ENABLED", "perhaps")],
)
def test_bad_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert str(err.value).startswith(variable) and "\n" not in str(err.value)


def test_cli_reports_a_bad_value_in_one_line_with_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YAK_EMBEDDER", "word2vec")
    result = subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "settings"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "YAK_EMBEDDER" in result.stderr
    assert "Traceback" not in result.stderr


def test_secrets_are_hidden_in_the_settings_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YAK_LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("YAK_ERROR_WEBHOOK", "https://discord.example/api/webhooks/secret-token")
    result = subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "settings", "--json"],
                            capture_output=True, text=True, check=True)
    assert "sk-very-secret" not in result.stdout and "secret-token" not in result.stdout
