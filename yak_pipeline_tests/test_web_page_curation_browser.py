"""Curating on the page in a real headless Chromium (issue 38, item 1): add a memory and find it
at once, edit a distillation's text (the new version in the history), change its tier and its type, the
Conflicts page with each side's date and the newer one named, the superseded mark on the memory
page.

A server and a browser of its own (the page tests' helpers: sign-in, following a click); each
test works on its own memories, so the order does not matter.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from yak_pipeline.api.app import create_app
from yak_pipeline.settings import Settings
from yak_pipeline.store.api_keys import create_api_key
from yak_pipeline.store.conflicts import record_conflict
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, serve_in_thread
from yak_pipeline_tests.browser import chromium
from yak_pipeline_tests.conftest import create_database, drop_database
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation
from yak_pipeline_tests.test_web_page_browser import Web, follow, shot, sign_in, text

NOW = datetime.now(UTC)
LISBON_SAID = NOW - timedelta(days=30)
PORTO_SAID = NOW - timedelta(days=2)
EXAM_SAID = NOW - timedelta(days=3)


@pytest.fixture(scope="module")
def web(pg_server_url: str, template_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    """The app under uvicorn on 127.0.0.1, on a database of its own: Alice moved from Lisbon to
    Porto (a conflict, the older side superseded), and memories to edit, re-tier and re-type."""
    name = f"yak_curate_{uuid.uuid4().hex[:12]}"
    url = create_database(pg_server_url, name, template=template_database)
    settings = Settings(home=tmp_path_factory.mktemp("yak-curate-home"), database_url=url, embedder="hashing",
                        admin_api_key=SecretStr(ADMIN_KEY))
    database = Database(url, max_size=4).open()
    ids: dict[str, str] = {}
    with database.connection() as conn:
        for key, exchange, fact, said, tier in (
                ("lisbon", "User: I live in Lisbon.\nAssistant: Great city.", "The user lives in Lisbon.", LISBON_SAID,
                 "core"),
                ("porto", "User: We moved to Porto last week.\nAssistant: Exciting!", "The user lives in Porto.",
                 PORTO_SAID, "core"),
                ("garbled", "User: My sister Ana lives in Gent.\nAssistant: Nice.",
                 "The user sister Ana live Gent in.", NOW - timedelta(days=5), "medium"),
                ("hobby", "User: I paint watercolours on Sundays.\nAssistant: Lovely.",
                 "The user paints watercolours on Sundays.", NOW - timedelta(days=4), "medium"),
                ("exam", "User: I passed my driving test yesterday.\nAssistant: Congratulations!",
                 "The user passed their driving test.", EXAM_SAID, "medium")):
            _, distillation_id = seed_memory_with_distillation(conn, user_id="alice", exchange=exchange,
                                                               distillation=fact, occurred_at=said, tier=tier)
            ids[key] = str(distillation_id)
        ids["conflict"] = str(record_conflict(conn, user_id="alice", a=ids["lisbon"], b=ids["porto"], score=0.91))
        _, alice_key = create_api_key(conn, user_id="alice", label="curation browser test")
    try:
        with serve_in_thread(create_app(settings, database=database)) as base_url:
            yield Web(base_url, database, alice_key, ids)
    finally:
        database.close()
        drop_database(pg_server_url, name)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium for the module."""
    with chromium() as driver:
        yield driver


@pytest.fixture
def page(browser: WebDriver, web: Web) -> WebDriver:
    """The browser signed in with Alice's key (a new browser session for each test)."""
    browser.delete_all_cookies()
    sign_in(browser, web, web.alice_key)
    assert browser.current_url == f"{web.url}/ui/u/alice"
    return browser


def _flash(driver: WebDriver) -> str:
    return driver.find_element(By.CSS_SELECTOR, ".flash").text


def _audit(database: Database, action: str, target: str) -> list[tuple]:
    with database.connection() as conn:
        return conn.execute("SELECT actor, detail FROM audit_log WHERE action = %s AND target_id = %s ORDER BY id",
                            (action, target)).fetchall()


def test_add_a_memory_and_recall_it_at_once(page: WebDriver, web: Web) -> None:
    box = page.find_element(By.ID, "memory-content")
    box.send_keys("User: I keep two beehives in my garden.")
    box.send_keys("\nAssistant: How much honey do they make?")  # the "User:/Assistant:" form, on two lines
    shot(page, "add-memory")
    follow(page, page.find_element(By.ID, "add-memory"))
    assert page.current_url == f"{web.url}/ui/u/alice/recent"
    assert _flash(page) == "added: recallable now; the pipeline distils it next"
    assert "I keep two beehives in my garden." in page.find_element(By.ID, "recent-exchanges").text
    with web.database.connection() as conn:
        content, status = conn.execute("SELECT content, status FROM memories WHERE content LIKE '%%beehives%%'"
                                       ).fetchone()
    assert (content, status) == ("User: I keep two beehives in my garden.\nAssistant: How much honey do they make?",
                                 "pending")

    # Not distilled yet, and recalled already: the user's own words (its vectors were made on adding).
    page.get(f"{web.url}/ui/u/alice/search?q=How+many+beehives+do+I+keep")
    # (The test's hashing embedder ranks a handful of memories about alike; being recalled is the point.)
    found = [h for h in page.find_elements(By.CSS_SELECTOR, "li.hit") if "beehives" in h.text]
    assert len(found) == 1, text(page)
    hit = found[0]
    assert hit.find_element(By.CSS_SELECTOR, "p.content").text == "I keep two beehives in my garden."
    assert "your own words" in hit.find_element(By.CSS_SELECTOR, "p.meta").text


def test_edit_a_distillations_text_and_see_the_new_version(page: WebDriver, web: Web) -> None:
    page.get(f"{web.url}/ui/u/alice/d/{web.ids['garbled']}")
    page.find_element(By.CSS_SELECTOR, "#edit summary").click()
    editor = page.find_element(By.ID, "edit-content")
    assert editor.get_attribute("value") == "The user sister Ana live Gent in."
    editor.clear()
    editor.send_keys("The user's sister Ana lives in Ghent.")
    follow(page, page.find_element(By.ID, "save-text"))
    assert page.current_url == f"{web.url}/ui/u/alice/d/{web.ids['garbled']}"
    assert _flash(page) == "saved as a new version: the old text stays in the version history"
    assert page.find_element(By.ID, "memory-text").text == "The user's sister Ana lives in Ghent."
    rows = [r.text for r in page.find_elements(By.CSS_SELECTOR, "#versions tbody tr")]
    assert len(rows) == 2, rows
    assert rows[0].startswith("1 distilled") and "The user sister Ana live Gent in." in rows[0]
    assert rows[1].startswith("2 manual") and "The user's sister Ana lives in Ghent." in rows[1]
    shot(page, "memory-edited")
    [(actor, detail)] = _audit(web.database, "version", web.ids["garbled"])
    assert actor == f"web:key:{web.alice_key[:10]}" and detail["reason"] == "manual" and detail["version"] == 2


def test_change_a_distillations_tier(page: WebDriver, web: Web) -> None:
    page.get(f"{web.url}/ui/u/alice/d/{web.ids['hobby']}")
    tier = Select(page.find_element(By.ID, "tier"))
    assert tier.first_selected_option.text == "medium"
    tier.select_by_visible_text("core")
    follow(page, page.find_element(By.ID, "set-tier"))
    assert _flash(page) == "tier is core now (was medium)"
    assert page.find_element(By.CSS_SELECTOR, "article .meta .tier").text == "core"
    assert Select(page.find_element(By.ID, "tier")).first_selected_option.text == "core"
    with web.database.connection() as conn:
        assert conn.execute("SELECT tier FROM distillations WHERE id = %s", (web.ids["hobby"],)).fetchone()[0] == "core"
    assert _audit(web.database, "tier", web.ids["hobby"]) == [(f"web:key:{web.alice_key[:10]}",
                                                               {"before": "medium", "after": "core"})]


def test_change_a_distillations_type(page: WebDriver, web: Web) -> None:
    page.get(f"{web.url}/ui/u/alice/d/{web.ids['exam']}")
    assert page.find_element(By.CSS_SELECTOR, "article .meta .mtype").text == "fact"  # as it was stored
    kind = Select(page.find_element(By.ID, "memory-type"))
    assert kind.first_selected_option.text == "fact"
    assert [o.text for o in kind.options] == ["instruction", "preference", "fact", "event"]
    kind.select_by_visible_text("event")
    follow(page, page.find_element(By.ID, "set-type"))
    assert _flash(page) == "type is event now (was fact)"
    # An event is dated from what the user said ("yesterday"), against when they said it.
    day = (EXAM_SAID - timedelta(days=1)).date()
    assert page.find_element(By.CSS_SELECTOR, "article .meta .mtype").text == f"event {day}"
    assert Select(page.find_element(By.ID, "memory-type")).first_selected_option.text == "event"
    shot(page, "memory-type")
    with web.database.connection() as conn:
        assert conn.execute("SELECT memory_type, event_on FROM distillations WHERE id = %s",
                            (web.ids["exam"],)).fetchone() == ("event", day)
    assert _audit(web.database, "type", web.ids["exam"]) == [(f"web:key:{web.alice_key[:10]}", {
        "before": "fact", "after": "event", "event_on_before": None, "event_on_after": day.isoformat()})]
    page.get(f"{web.url}/ui/u/alice/recent")  # the list of memories shows the type too
    row = page.find_element(By.XPATH,
                            "//table[@id='recent-distillations']//tr[td/a[text()='The user passed their driving test.']]")
    assert row.find_element(By.CSS_SELECTOR, ".mtype").text == f"event {day}"


def test_conflicts_page_dates_each_side_and_names_the_newer(page: WebDriver, web: Web) -> None:
    follow(page, page.find_element(By.LINK_TEXT, "Conflicts"))
    conflict = page.find_element(By.CSS_SELECTOR, f"section.conflict[data-id='{web.ids['conflict']}']")
    sides = {s.find_element(By.CSS_SELECTOR, "p a").text: s for s in conflict.find_elements(By.CSS_SELECTOR, ".side")}
    assert set(sides) == {"The user lives in Lisbon.", "The user lives in Porto."}
    lisbon, porto = sides["The user lives in Lisbon."], sides["The user lives in Porto."]
    assert lisbon.find_element(By.CSS_SELECTOR, ".said").text == f"said {LISBON_SAID:%Y-%m-%d %H:%M}"
    assert porto.find_element(By.CSS_SELECTOR, ".said").text == f"said {PORTO_SAID:%Y-%m-%d %H:%M}"
    assert porto.find_element(By.CSS_SELECTOR, "h3 .newer").text == "newer"
    assert not lisbon.find_elements(By.CSS_SELECTOR, ".newer")
    side = porto.find_element(By.TAG_NAME, "h3").text.split()[0]  # "A" or "B": the store orders the pair by id
    assert conflict.find_element(By.CSS_SELECTOR, ".newer-note").text.startswith(f"{side} is newer")


def test_superseded_mark_on_the_memory_page(page: WebDriver, web: Web) -> None:
    page.get(f"{web.url}/ui/u/alice/d/{web.ids['lisbon']}")
    meta = page.find_element(By.CSS_SELECTOR, "article p.meta")
    assert meta.find_element(By.CSS_SELECTOR, ".mark-superseded").text == "superseded"
    assert meta.find_element(By.CSS_SELECTOR, ".mark-conflict").text == "in conflict"
    note = page.find_element(By.ID, "superseded-note")
    assert "The user lives in Porto." in note.text and f"said {PORTO_SAID:%Y-%m-%d %H:%M}" in note.text
    other = page.find_element(By.CSS_SELECTOR, "li.other-side").text  # the conflict, dated, from this side
    assert other.startswith(f"The user lives in Porto. — said {PORTO_SAID:%Y-%m-%d %H:%M}, newer"), other
    shot(page, "memory-superseded")
    follow(page, note.find_element(By.LINK_TEXT, "The user lives in Porto."))  # the newer one says what it replaced
    assert page.current_url == f"{web.url}/ui/u/alice/d/{web.ids['porto']}"
    assert not page.find_elements(By.CSS_SELECTOR, "article .mark-superseded")
    assert "The user lives in Lisbon." in page.find_element(By.ID, "supersedes-note").text
    assert ", older (score" in page.find_element(By.CSS_SELECTOR, "li.other-side").text

    page.get(f"{web.url}/ui/u/alice/recent")  # the list of memories marks it too
    row = page.find_element(By.XPATH, "//table[@id='recent-distillations']//tr[td/a[text()='The user lives in Lisbon.']]")
    assert row.find_elements(By.CSS_SELECTOR, ".mark-superseded")
    page.get(f"{web.url}/ui/u/alice/review")  # so does the review queue (both sides of the conflict wait there)
    assert page.find_elements(By.CSS_SELECTOR, f"tr[data-id='{web.ids['lisbon']}'] .mark-superseded")
    assert not page.find_elements(By.CSS_SELECTOR, f"tr[data-id='{web.ids['porto']}'] .mark-superseded")
    page.get(f"{web.url}/ui/u/alice")  # and the overview counts it apart from the active memories
    assert page.find_element(By.ID, "count-superseded").text == "1"
