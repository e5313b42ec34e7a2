"""The web page (/ui) over HTTP: sign-in, CSRF, scoping, the actions' effects and audit rows.

The browser tests (test_web_page_browser.py) drive the same page in Chromium; these check what a
browser does not show: refused forms change nothing, headers, the audit log's actor.
"""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, Seeded, api_settings, app, seeded  # noqa: F401

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    """The CSRF token a page's forms carry."""
    match = _CSRF.search(html)
    assert match, "the page has no form with a CSRF token"
    return match.group(1)


def signed_in(app, key: str) -> tuple[TestClient, str]:  # noqa: ANN001 - FastAPI
    """A client signed in to the page with ``key``, and its session's CSRF token."""
    client = TestClient(app, raise_server_exceptions=False, follow_redirects=False)
    form = client.get("/ui/login")
    assert form.status_code == 200
    answer = client.post("/ui/login", data={"api_key": key, "csrf_token": csrf_of(form.text)})
    assert answer.status_code == 303, answer.text
    return client, csrf_of(client.get(answer.headers["location"]).text)


def _distillation(database: Database, distillation_id: str) -> tuple:
    with database.connection() as conn:
        return conn.execute("SELECT status, needs_review, user_weight FROM distillations WHERE id = %s",
                            (distillation_id,)).fetchone()


def test_sign_in_lands_on_the_callers_home_and_a_bad_key_is_one_line(app, seeded: Seeded) -> None:  # noqa: ANN001
    client = TestClient(app, raise_server_exceptions=False, follow_redirects=False)
    assert client.get("/ui/u/alice").headers["location"] == "/ui/login"
    form = client.get("/ui/login")
    cookie = form.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age" not in cookie and "expires" not in cookie
    bad = client.post("/ui/login", data={"api_key": "not-a-key", "csrf_token": csrf_of(form.text)})
    assert bad.status_code == 401 and "invalid or revoked API key" in bad.text
    user = client.post("/ui/login", data={"api_key": seeded.alice_key, "csrf_token": csrf_of(bad.text)})
    assert user.headers["location"] == "/ui/u/alice"
    assert user.headers["set-cookie"].split(";")[0] != cookie.split(";")[0], "sign-in keeps the anonymous session id"
    admin, _ = signed_in(app, ADMIN_KEY)
    users = admin.get("/ui/users")
    assert "alice" in users.text and "bob" in users.text
    assert admin.get("/ui/users", params={"user": "bob"}).headers["location"] == "/ui/u/bob"


def test_pages_forbid_scripts_and_caching(app, seeded: Seeded) -> None:  # noqa: ANN001
    client, _ = signed_in(app, seeded.alice_key)
    for path in ("/ui/u/alice", "/ui/u/alice/search?q=locker", "/ui/u/alice/recent", "/ui/u/alice/review",
                 "/ui/u/alice/conflicts", "/ui/u/alice/pipeline", f"/ui/u/alice/d/{seeded.alice.distillation_id}"):
        page = client.get(path)
        assert page.status_code == 200, (path, page.text[:300])
        assert "script-src" not in page.headers["content-security-policy"]  # default-src 'none' covers scripts
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert page.headers["cache-control"] == "no-store"


def test_forms_without_the_sessions_csrf_token_change_nothing(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    client, csrf = signed_in(app, seeded.alice_key)
    target = seeded.alice.review_id
    for token in ("", "forged-token"):
        refused = client.post(f"/ui/u/alice/review/{target}/approve", data={"csrf_token": token})
        assert refused.status_code == 403 and "reload the page" in refused.text
    other, _ = signed_in(app, seeded.alice_key)  # another browser's token is not this one's
    assert other.post(f"/ui/u/alice/review/{target}/approve", data={"csrf_token": csrf}).status_code == 403
    assert _distillation(database, target)[:2] == ("review", True)
    assert client.post(f"/ui/u/alice/review/{target}/approve", data={"csrf_token": csrf}).status_code == 303
    assert _distillation(database, target)[:2] == ("active", False)


def test_actions_are_audited_as_the_web_page(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    client, csrf = signed_in(app, seeded.alice_key)
    a = seeded.alice
    pinned = client.post(f"/ui/u/alice/d/{a.distillation_id}/weight", data={"csrf_token": csrf, "user_weight": "2.5"})
    assert pinned.status_code == 303
    assert _distillation(database, a.distillation_id)[2] == 2.5
    too_heavy = client.post(f"/ui/u/alice/d/{a.distillation_id}/weight", data={"csrf_token": csrf, "user_weight": "11"})
    assert too_heavy.status_code == 422 and "user_weight" in too_heavy.text
    with database.connection() as conn:
        side_a, side_b = conn.execute("SELECT distillation_a::text, distillation_b::text FROM conflicts WHERE id = %s",
                                      (a.conflict_id,)).fetchone()
    kept = client.post(f"/ui/u/alice/conflicts/{a.conflict_id}/a", data={"csrf_token": csrf})
    assert kept.status_code == 303
    assert _distillation(database, side_b)[0] == "rejected"
    assert _distillation(database, side_a)[:2] == ("active", False)
    with database.connection() as conn:
        actions = conn.execute("SELECT action, actor FROM audit_log WHERE actor LIKE 'web:%' ORDER BY id").fetchall()
        conflict = conn.execute("SELECT status, resolution FROM conflicts WHERE id = %s", (a.conflict_id,)).fetchone()
    assert {action for action, _ in actions} == {"weight", "approve", "reject", "conflict_resolved"}
    # The key's display prefix names it in the audit log (as the API's "api:key:…"), never the key.
    assert {actor for _, actor in actions} == {f"web:key:{seeded.alice_key[:10]}"}
    assert conflict == ("resolved", f"kept {side_a}")


def test_forget_by_phrase_asks_first_and_the_token_works_once(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    client, csrf = signed_in(app, seeded.alice_key)
    asked = client.post("/ui/u/alice/forget", data={"csrf_token": csrf, "phrase": "tea"})
    assert asked.status_code == 200 and "Forget 1 memory?" in asked.text
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories WHERE user_id = 'alice'").fetchone()[0] == 3
    token = re.search(r'name="token" value="([^"]+)"', asked.text).group(1)
    done = client.post("/ui/u/alice/forget/confirm", data={"csrf_token": csrf, "token": token})
    assert done.status_code == 303
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories WHERE user_id = 'alice'").fetchone()[0] == 2
    again = client.post("/ui/u/alice/forget/confirm", data={"csrf_token": csrf, "token": token})
    assert again.status_code == 404 and "unknown, used or expired" in again.text
    nothing = client.post("/ui/u/alice/forget", data={"csrf_token": csrf, "phrase": "no such words"})
    assert nothing.status_code == 303


def test_a_revoked_key_ends_its_sessions(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    client, _ = signed_in(app, seeded.alice_key)
    assert client.get("/ui/u/alice").status_code == 200
    with database.connection() as conn:
        conn.execute("UPDATE api_keys SET revoked_at = now() WHERE user_id = 'alice'")
    assert client.get("/ui/u/alice").headers["location"] == "/ui/login"


def test_a_database_outage_is_an_error_page(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    client, _ = signed_in(app, ADMIN_KEY)  # admin keys are checked without the database
    database.close()
    page = client.get("/ui/u/alice")
    assert page.status_code == 503 and "the database is unavailable" in page.text
    assert page.headers["content-type"].startswith("text/html")
