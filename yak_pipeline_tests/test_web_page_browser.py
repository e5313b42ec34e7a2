"""The web page in a real headless Chromium (Debian's, through chromedriver): sign in, search,
open a hit, approve a review item, forget with confirmation and see it gone, a user-scoped key
that cannot reach another user's page or action, memory text holding HTML shown as text, and
``/docs`` rendering with nothing fetched from outside.

One server and one browser serve the whole module (Chromium takes a second or two to start);
each test signs in afresh and works on its own memories. With ``SCREENSHOTS_DIR`` set, the main
views are saved there as PNG (``make screenshots`` refreshes ``docs/screenshots/``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from yak_pipeline.api.app import create_app
from yak_pipeline.llm.rules import RulesProvider
from yak_pipeline.services.curation import merge_distillations
from yak_pipeline.settings import Settings
from yak_pipeline.store.api_keys import create_api_key
from yak_pipeline.store.conflicts import record_conflict
from yak_pipeline.store.database import Database
from yak_pipeline.store.memories import insert_memory, new_exchange, record_memory_error
from yak_pipeline.store.warmth import apply_relevance
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, rows_mentioning, serve_in_thread
from yak_pipeline_tests.browser import chromium
from yak_pipeline_tests.conftest import create_database, drop_database
from yak_pipeline_tests.store_helpers import EMBEDDER, seed_memory_with_distillation

SCREENSHOTS = Path(os.environ["SCREENSHOTS_DIR"]) if os.environ.get("SCREENSHOTS_DIR") else None
HOSTILE = """<script>document.title='pwned'</script><img src=x onerror="document.title='pwned'"> <b>bold claim</b>"""


@dataclass(frozen=True)
class Web:
    """The served app and the rows the tests look for."""

    url: str
    database: Database
    alice_key: str
    ids: dict[str, str]


def _seed(conn, ids: dict[str, str]) -> None:  # noqa: ANN001 - a psycopg connection
    """Alice's memory as a person would have it after a few weeks, and one of Bob's."""
    now = datetime.now(UTC)

    def remember(key: str, user: str, exchange: str, fact: str, days_ago: float, **kwargs: object) -> None:
        memory_id, distillation_id = seed_memory_with_distillation(
            conn, user_id=user, exchange=exchange, distillation=fact, occurred_at=now - timedelta(days=days_ago),
            **kwargs)
        ids[key], ids[f"{key}_memory"] = str(distillation_id), str(memory_id)

    remember("nurse", "alice", "User: I just started as a nurse at the children's hospital.\nAssistant: Congratulations!",
             "The user works as a nurse at a children's hospital.", 20, tier="core", confidence=0.93)
    remember("kyoto", "alice", "User: I'm going to Kyoto in April.\nAssistant: Lovely season for it.",
             "The user is planning a trip to Kyoto in April.", 12, confidence=0.88)
    remember("temples", "alice", "User: In Kyoto I want to see the temples.\nAssistant: Try Tenryu-ji.",
             "The user wants to visit temples in Kyoto.", 11, confidence=0.86)
    remember("vegetarian", "alice", "User: Remember that I'm vegetarian.\nAssistant: Noted.",
             "The user is vegetarian.", 9, tier="core", confidence=0.97)
    remember("lisbon", "alice", "User: I live in Lisbon.\nAssistant: Great city.", "The user lives in Lisbon.", 30,
             tier="core", confidence=0.9)
    remember("porto", "alice", "User: We moved to Porto last week.\nAssistant: Exciting!", "The user lives in Porto.", 2,
             tier="core", confidence=0.9)
    remember("window", "alice", "User: Maybe book me a window seat?\nAssistant: Sure.",
             "The user may prefer window seats on flights.", 5, confidence=0.5)
    remember("gym", "alice", "User: My old gym locker code is HAZEL-4471.\nAssistant: Got it.",
             "The user's old gym locker code is HAZEL-4471.", 4, tier="low", confidence=0.82)
    remember("hostile", "alice", f"User: Save this: {HOSTILE}\nAssistant: Saved.", f"The user said {HOSTILE}.", 3,
             confidence=0.9)
    remember("bob_pin", "bob", "User: My bank PIN hint is CRIMSON-4402.\nAssistant: Noted.",
             "The user's bank PIN hint is CRIMSON-4402.", 1, confidence=0.9)
    remember("bob_review", "bob", "User: Maybe I like jazz?\nAssistant: Maybe.", "The user may like jazz.", 1,
             confidence=0.5)
    stuck = insert_memory(conn, new_exchange(user_id="alice", content="User: Summarise the attached report.\nAssistant: Here it is.", source="api",
                                             occurred_at=now - timedelta(hours=1)))
    record_memory_error(conn, stuck.id, "the LLM answered invalid JSON 3 times", give_up=True)
    ids["conflict"] = str(record_conflict(conn, user_id="alice", a=ids["lisbon"], b=ids["porto"], score=0.91))
    for key, score in (("nurse", 0.9), ("vegetarian", 0.95), ("kyoto", 0.2)):
        apply_relevance(conn, ids[key], relevance_score=score, reason="turn", evaluator="test")


@pytest.fixture(scope="module")
def web(pg_server_url: str, template_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    """The app under uvicorn on 127.0.0.1, on a database of its own for this module."""
    name = f"yak_web_{uuid.uuid4().hex[:12]}"
    url = create_database(pg_server_url, name, template=template_database)
    home = tmp_path_factory.mktemp("yak-web-home")
    settings = Settings(home=home, database_url=url, embedder="hashing", admin_api_key=SecretStr(ADMIN_KEY))
    failed = home / "drop" / "failed"  # one refused drop file, as the pipeline page shows them
    failed.mkdir(parents=True)
    (failed / "march-chats.jsonl").write_text('{"user_id": "alice"}\n')
    (failed / "march-chats.jsonl.error.txt").write_text("line 1: a record needs 'user' and 'assistant', or 'content'\n")
    database = Database(url, max_size=4).open()
    ids: dict[str, str] = {}
    with database.connection() as conn:
        _seed(conn, ids)
        _, alice_key = create_api_key(conn, user_id="alice", label="browser test")
    merge_distillations(database, RulesProvider(), EMBEDDER, keep_id=ids["kyoto"], merge_id=ids["temples"],
                        content="The user is planning a trip to Kyoto in April and wants to visit its temples.",
                        user_id="alice", actor="test")
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
    """The browser, signed out (a new browser session for each test)."""
    browser.delete_all_cookies()
    return browser


def shot(driver: WebDriver, name: str, *, max_height: int = 1800) -> None:
    """Save the page as ``SCREENSHOTS_DIR/<name>.png`` (its full height, up to ``max_height``), when
    screenshots are asked for."""
    if SCREENSHOTS is None:
        return
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(700, min(int(height) + 40, max_height)))
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
    driver.set_window_size(1280, 900)


def follow(driver: WebDriver, element: WebElement) -> None:
    """Click a link or a form's button and wait until the next page replaced this one (a click
    returns once the navigation has started, not when it is done)."""
    # A mark on this document's window: the next document starts without it.
    driver.execute_script("window.yakPreviousPage = true;")
    element.click()
    # Chromedriver may refuse a script while the old document goes away: poll again then.
    WebDriverWait(driver, 10, ignored_exceptions=(WebDriverException,)).until(lambda d: d.execute_script(
        "return window.yakPreviousPage === undefined && document.readyState === 'complete';"))


def sign_in(driver: WebDriver, web: Web, key: str) -> None:
    """Sign in through the form, as a person does."""
    driver.get(f"{web.url}/ui")
    assert driver.current_url == f"{web.url}/ui/login"
    driver.find_element(By.ID, "api_key").send_keys(key)
    follow(driver, driver.find_element(By.ID, "sign-in"))


def text(driver: WebDriver) -> str:
    """The visible text of the page."""
    return driver.find_element(By.TAG_NAME, "body").text


def distillation_row(database: Database, distillation_id: str) -> tuple | None:
    with database.connection() as conn:
        return conn.execute("SELECT status, needs_review FROM distillations WHERE id = %s",
                            (distillation_id,)).fetchone()


def test_sign_in_search_and_open_a_hit(page: WebDriver, web: Web) -> None:
    page.get(f"{web.url}/ui")
    shot(page, "login")
    sign_in(page, web, ADMIN_KEY)
    assert page.current_url == f"{web.url}/ui/users"
    users = [a.text for a in page.find_elements(By.CSS_SELECTOR, "table a")]
    assert users[:2] == ["alice", "bob"]  # most recent exchange first
    assert "0 exchanges waiting to be distilled" in page.find_element(By.ID, "queue-all").text
    assert "1 failed" in page.find_element(By.ID, "queue-all").text  # Alice's report that failed for good
    shot(page, "users")
    follow(page, page.find_element(By.LINK_TEXT, "alice"))
    assert page.find_element(By.ID, "count-review").text == "3"  # the window seat (0.5), Lisbon and Porto (a conflict)
    shot(page, "overview")

    box = page.find_element(By.NAME, "q")
    box.send_keys("Where does the user work as a nurse?")
    follow(page, page.find_element(By.CSS_SELECTOR, "form.search button"))
    hits = page.find_elements(By.CSS_SELECTOR, "li.hit")
    assert hits, text(page)
    first = hits[0]
    assert first.find_element(By.CSS_SELECTOR, "a.open-hit").text == "The user works as a nurse at a children's hospital."
    meta = first.find_element(By.CSS_SELECTOR, "p.meta").text
    for shown in ("core", "confidence 0.93", "warmth 0.60", "score"):
        assert shown in meta, meta
    first.find_element(By.CSS_SELECTOR, "details.breakdown summary").click()
    breakdown = first.find_element(By.CSS_SELECTOR, "details.breakdown table").text
    assert "relevance" in breakdown and "gravity 2.00 (tier × user_weight)" in breakdown  # core × 1
    raw = first.find_element(By.CSS_SELECTOR, "details.exchange pre")
    assert not raw.is_displayed()
    first.find_element(By.CSS_SELECTOR, "details.exchange summary").click()
    assert raw.is_displayed() and "I just started as a nurse" in raw.text
    shot(page, "search")

    follow(page, first.find_element(By.CSS_SELECTOR, "a.open-hit"))
    assert page.current_url == f"{web.url}/ui/u/alice/d/{web.ids['nurse']}"
    assert page.find_element(By.ID, "memory-text").text == "The user works as a nurse at a children's hospital."
    assert "distilled" in page.find_element(By.CSS_SELECTOR, "table").text

    page.get(f"{web.url}/ui/u/alice/d/{web.ids['kyoto']}")  # a merged memory shows where it came from
    versions = page.find_element(By.CSS_SELECTOR, "table").text
    assert "merged" in versions and web.ids["temples"][:8] in versions
    shot(page, "memory")

    follow(page, page.find_element(By.LINK_TEXT, "Pipeline"))  # an admin also sees the drop folder's quarantine
    assert "the LLM answered invalid JSON 3 times" in text(page)
    quarantine = page.find_element(By.ID, "quarantine").text
    assert "march-chats.jsonl" in quarantine and "line 1: a record needs 'user' and 'assistant'" in quarantine
    shot(page, "pipeline")


def test_approve_a_review_item(page: WebDriver, web: Web) -> None:
    sign_in(page, web, web.alice_key)
    assert page.current_url == f"{web.url}/ui/u/alice"
    follow(page, page.find_element(By.LINK_TEXT, "Review"))
    row = page.find_element(By.CSS_SELECTOR, f"tr[data-id='{web.ids['window']}']")
    assert "held back" in row.text
    shot(page, "review")
    follow(page, row.find_element(By.CSS_SELECTOR, "button.approve"))
    assert page.find_element(By.CSS_SELECTOR, ".flash").text == "approved: it is recallable now"
    assert not page.find_elements(By.CSS_SELECTOR, f"tr[data-id='{web.ids['window']}']")
    assert distillation_row(web.database, web.ids["window"]) == ("active", False)
    with web.database.connection() as conn:
        actor = conn.execute("SELECT actor FROM audit_log WHERE action = 'approve' AND target_id = %s",
                             (web.ids["window"],)).fetchone()[0]
    assert actor == f"web:key:{web.alice_key[:10]}"
    follow(page, page.find_element(By.LINK_TEXT, "Conflicts"))
    assert "The user lives in Lisbon." in text(page) and "The user lives in Porto." in text(page)
    shot(page, "conflicts")


def test_forget_a_memory_with_confirmation_and_it_is_gone(page: WebDriver, web: Web) -> None:
    sign_in(page, web, web.alice_key)
    page.get(f"{web.url}/ui/u/alice/d/{web.ids['gym']}")
    follow(page, page.find_element(By.ID, "forget"))
    assert "Forget 1 memory?" in text(page)
    assert "My old gym locker code is HAZEL-4471." in text(page)
    shot(page, "forget")
    follow(page, page.find_element(By.ID, "cancel-forget"))  # asking first deletes nothing
    assert "The user's old gym locker code is HAZEL-4471." in text(page)
    assert distillation_row(web.database, web.ids["gym"]) == ("active", False)

    page.get(f"{web.url}/ui/u/alice/d/{web.ids['gym']}")
    follow(page, page.find_element(By.ID, "forget"))
    follow(page, page.find_element(By.ID, "confirm-forget"))
    assert page.current_url == f"{web.url}/ui/u/alice/recent"
    assert page.find_element(By.CSS_SELECTOR, ".flash").text.startswith(f"forgot memory {web.ids['gym_memory']}")
    assert "HAZEL-4471" not in text(page)
    page.get(f"{web.url}/ui/u/alice/search?q=old+gym+locker+code+HAZEL-4471")
    assert "HAZEL-4471" not in text(page)
    page.get(f"{web.url}/ui/u/alice/d/{web.ids['gym']}")
    assert page.find_element(By.ID, "error-message").text == f"distillation {web.ids['gym']} not found"
    with web.database.connection() as conn:
        assert rows_mentioning(conn, "HAZEL-4471") == {}


def test_a_user_key_cannot_reach_another_users_page_or_action(page: WebDriver, web: Web) -> None:
    sign_in(page, web, web.alice_key)
    for path in ("/ui/u/bob", "/ui/u/bob/search?q=bank+PIN", "/ui/u/bob/review",
                 f"/ui/u/bob/d/{web.ids['bob_pin']}", f"/ui/u/bob/m/{web.ids['bob_pin_memory']}/forget"):
        page.get(web.url + path)
        assert page.find_element(By.ID, "error-message").text == "this API key is scoped to another user", path
        assert "CRIMSON" not in page.page_source
    page.get(f"{web.url}/ui/u/alice/d/{web.ids['bob_pin']}")  # Bob's id under Alice's pages: not found
    assert page.find_element(By.ID, "error-message").text == f"distillation {web.ids['bob_pin']} not found"
    page.get(f"{web.url}/ui/users")  # no list of users for a user key
    assert page.current_url == f"{web.url}/ui/u/alice"

    # Actions: a form of Alice's own page (with her valid CSRF token) pointed at Bob's items.
    for action, message in ((f"/ui/u/bob/review/{web.ids['bob_review']}/approve", "this API key is scoped to another user"),
                            (f"/ui/u/alice/review/{web.ids['bob_review']}/approve", f"distillation {web.ids['bob_review']} not found"),
                            (f"/ui/u/bob/m/{web.ids['bob_pin_memory']}/forget", "this API key is scoped to another user")):
        page.get(f"{web.url}/ui/u/alice")
        sign_out = page.find_element(By.ID, "sign-out")
        page.execute_script("arguments[0].form.action = arguments[1];", sign_out, action)
        follow(page, sign_out)
        assert page.find_element(By.ID, "error-message").text == message, action
    assert distillation_row(web.database, web.ids["bob_review"]) == ("review", True)
    assert distillation_row(web.database, web.ids["bob_pin"]) == ("active", False)


def test_memory_text_with_html_is_shown_as_text(page: WebDriver, web: Web) -> None:
    sign_in(page, web, web.alice_key)
    page.get(f"{web.url}/ui/u/alice/recent")
    table = page.find_element(By.ID, "recent-distillations")
    assert f"The user said {HOSTILE}." in table.text
    shot(page, "recent")
    assert not table.find_elements(By.TAG_NAME, "b") and not table.find_elements(By.TAG_NAME, "img")
    page.get(f"{web.url}/ui/u/alice/d/{web.ids['hostile']}")
    assert page.find_element(By.ID, "memory-text").text == f"The user said {HOSTILE}."
    page.find_element(By.CSS_SELECTOR, "#raw-exchange summary").click()
    assert HOSTILE in page.find_element(By.CSS_SELECTOR, "#raw-exchange pre").text
    assert not page.find_elements(By.CSS_SELECTOR, "main script, main img, main b")
    assert page.title != "pwned" and "Memory" in page.title
    page.get(f"{web.url}/ui/u/alice/search?q=bold+claim")
    assert HOSTILE in text(page) and page.title != "pwned"


def test_docs_render_offline(page: WebDriver, web: Web) -> None:
    page.get(f"{web.url}/docs")
    WebDriverWait(page, 20).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) > 10)
    assert page.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title").text.startswith("Yak")
    assert page.find_elements(By.CSS_SELECTOR, ".opblock-summary-path[data-path='/api/distillations/search']")
    fetched = page.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert fetched and all(name.startswith(web.url + "/") for name in fetched), fetched
    shot(page, "docs", max_height=1100)
