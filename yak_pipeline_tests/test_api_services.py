"""``ApiServices`` is a view of the parts it is made from: what either builds, both use, and the
app's own admin keys, metrics and memory proxy stay the app's."""

from __future__ import annotations

import pytest

from yak_pipeline.api.dependencies import ApiServices
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.wiring import build_parts
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, api_settings  # noqa: F401


def test_the_services_share_what_their_parts_build(api_settings: Settings, database: Database) -> None:
    parts = build_parts(api_settings, database=database)
    services = ApiServices.of(parts, extra_admin_keys=("cli-key",))
    assert services.database is database and services.settings is parts.settings
    # Built through either, each part is built once and seen by both.
    assert services.embedder is parts.embedder
    assert parts.llm is services.llm
    assert services.admin_keys == (ADMIN_KEY, "cli-key")
    assert ADMIN_KEY not in repr(services)
    # The memory proxy is the app's own, made on first use.
    assert services.proxy_if_open is None
    proxy = services.proxy
    assert services.proxy is proxy and services.proxy_if_open is proxy
    assert ApiServices.of(parts).proxy_if_open is None


def test_parts_are_given_to_build_parts_not_beside_yak_parts(api_settings: Settings, database: Database) -> None:
    with pytest.raises(ValueError, match="build_parts"):
        ApiServices.of(build_parts(api_settings), database=database)
