"""Curating on the page (issue 38, item 1), without a browser: the service functions it added
(a distillation's tier, supersession, one definition of an active memory, the newer side of a
conflict) and what the page's forms do with bad input, plus the plain-language notes.

The browser tests (test_web_page_curation_browser.py) click through the same actions.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from starlette.testclient import TestClient

from yak_pipeline.alerts import Alerter
from yak_pipeline.api.app import create_app
from yak_pipeline.core.dedup import newer_side
from yak_pipeline.core.wording import plural, weight_note
from yak_pipeline.embeddings.openai_embedder import OpenAIEmbedder
from yak_pipeline.services.curation import list_conflicts, set_tier
from yak_pipeline.services.memories import forget_memory
from yak_pipeline.services.memory_export import memory_markdown
from yak_pipeline.services.overview import distillation_page, user_overview, users_overview
from yak_pipeline.settings import Settings
from yak_pipeline.store.conflicts import record_conflict
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import mark_superseded_by_newer, set_distillation_status
from yak_pipeline.store.memories import insert_memory, new_exchange
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, Seeded, api_settings, app, client_with, seeded  # noqa: F401
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation
from yak_pipeline_tests.test_cli_inprocess import run  # noqa: F401 - the in-process `yak` fixture
from yak_pipeline_tests.test_web_page import signed_in

NOW = datetime.now(UTC)


def _audit(conn: psycopg.Connection, action: str, target: object) -> list[tuple]:
    return conn.execute("SELECT actor, detail FROM audit_log WHERE action = %s AND target_id = %s ORDER BY id",
                        (action, str(target))).fetchall()


def test_set_tier_changes_the_tier_audited_and_scoped(database: Database) -> None:
    with database.connection() as conn:
        _, did = seed_memory_with_distillation(conn, user_id="maria", exchange="User: I am a pilot.\nAssistant: Nice.",
                                               distillation="The user is a pilot.", tier="medium")
    assert set_tier(database, did, tier="core", user_id="maria", actor="web:admin") == "medium"
    assert set_tier(database, did, tier="core", user_id="maria", actor="web:admin") == "core"  # unchanged: no row
    assert set_tier(database, did, tier="low", user_id="ivan", actor="web:admin") is None  # another user's id
    with pytest.raises(ValueError, match="tier must be one of core, medium, low"):
        set_tier(database, did, tier="urgent", user_id="maria", actor="web:admin")
    with database.connection() as conn:
        assert conn.execute("SELECT tier FROM distillations WHERE id = %s", (did,)).fetchone()[0] == "core"
        assert _audit(conn, "tier", did) == [("web:admin", {"before": "medium", "after": "core"})]


def test_supersession_shows_on_both_memories_and_a_forgotten_superseder_does_not_count(database: Database) -> None:
    with database.connection() as conn:
        _, lisbon = seed_memory_with_distillation(conn, user_id="maria", exchange="User: I live in Lisbon.",
                                                  distillation="The user lives in Lisbon.",
                                                  occurred_at=NOW - timedelta(days=30))
        porto_memory, porto = seed_memory_with_distillation(conn, user_id="maria", exchange="User: I moved to Porto.",
                                                            distillation="The user lives in Porto.",
                                                            occurred_at=NOW - timedelta(days=2))
        assert mark_superseded_by_newer(conn, lisbon, porto, actor="test", user_id="maria") == str(lisbon)
    old = distillation_page(database, lisbon, user_id="maria")
    new = distillation_page(database, porto, user_id="maria")
    assert old["superseded_by"]["id"] == porto and old["superseded_by"]["content"] == "The user lives in Porto."
    assert old["superseded_by"]["said_at"] == NOW - timedelta(days=2) and old["supersedes"] == []
    assert new["superseded_by"] is None and [o["id"] for o in new["supersedes"]] == [lisbon]
    with database.connection() as conn:
        conn.execute("UPDATE distillations SET deleted_at = now() WHERE id = %s", (porto,))
        conn.execute("UPDATE memories SET deleted_at = now() WHERE id = %s", (porto_memory,))
    assert distillation_page(database, lisbon, user_id="maria")["superseded_by"] is None  # current again


def test_every_count_of_active_memories_agrees_with_memory_md(database: Database) -> None:
    # The Users page counted every 'active' row (9) where MEMORY.md left the superseded one out (8).
    with database.connection() as conn:
        ids = {}
        for n, (fact, days) in enumerate([("The user lives in Lisbon.", 30), ("The user lives in Porto.", 2),
                                          ("The user is vegetarian.", 9), ("The user likes jazz.", 5),
                                          ("The user may like opera.", 4), ("The user has a cat.", 3)]):
            _, ids[n] = seed_memory_with_distillation(conn, user_id="maria", exchange=f"User: {fact}",
                                                      distillation=fact, occurred_at=NOW - timedelta(days=days),
                                                      confidence=0.5 if "may" in fact else 0.9)
        mark_superseded_by_newer(conn, ids[0], ids[1], actor="test", user_id="maria")  # Lisbon: superseded
        set_distillation_status(conn, ids[3], status="merged", actor="test")  # jazz: merged away
        # The cat: an active row whose exchange was soft-forgotten (a read path must not count it).
        conn.execute("UPDATE memories SET deleted_at = now() FROM distillations d "
                     "WHERE d.id = %s AND memories.id = d.memory_id", (ids[5],))
        insert_memory(conn, new_exchange(user_id="maria", content="User: not distilled yet", source="api", occurred_at=NOW))
    alerter = Alerter()
    counts, _ = user_overview(database, alerter, "maria")
    users, _ = users_overview(database, alerter)
    text, listed = memory_markdown(database, "maria")
    assert listed == 2 and "Porto" in text and "vegetarian" in text and "Lisbon" not in text
    assert counts["active"] == listed == next(u["active_memories"] for u in users if u["user_id"] == "maria")
    assert counts["superseded"] == 1 and counts["to_review"] == 1 and counts["merged"] == 1


def test_the_newer_side_of_a_conflict_is_the_one_said_later(database: Database) -> None:
    earlier, later = NOW - timedelta(days=3), NOW - timedelta(hours=1)
    assert newer_side(earlier, later) == "b" and newer_side(later, earlier) == "a"
    assert newer_side(later, later) is None  # said together: neither is newer
    with database.connection() as conn:
        _, a = seed_memory_with_distillation(conn, user_id="maria", exchange="User: I drink tea.",
                                             distillation="The user drinks tea.", occurred_at=later)
        _, b = seed_memory_with_distillation(conn, user_id="maria", exchange="User: I never drink tea.",
                                             distillation="The user never drinks tea.", occurred_at=earlier)
        record_conflict(conn, user_id="maria", a=a, b=b, score=0.9)
    [conflict] = list_conflicts(database, user_id="maria", status="open")
    said = {str(conflict["distillation_a"]): conflict["said_a"], str(conflict["distillation_b"]): conflict["said_b"]}
    assert said == {str(a): later, str(b): earlier}  # the store orders the pair by id, each side keeps its date


def _flash(client: TestClient, answer) -> str:  # noqa: ANN001 - an httpx response
    assert answer.status_code == 303, answer.text[:300]
    page = client.get(answer.headers["location"]).text
    return re.search(r'<p class="flash" role="status">([^<]*)</p>', page).group(1)


def test_add_and_edit_refuse_bad_text_with_one_line_and_keep_what_was_typed(app, seeded: Seeded,  # noqa: ANN001, F811
                                                                           database: Database) -> None:
    client, csrf = signed_in(app, seeded.alice_key)
    blank = client.post("/ui/u/alice/memories", data={"csrf_token": csrf, "content": "  \r\n "})
    assert blank.status_code == 422 and "content: must not be blank" in blank.text
    too_long = "The user likes " + "very " * 900 + "long texts."
    refused = client.post(f"/ui/u/alice/d/{seeded.alice.distillation_id}/text",
                          data={"csrf_token": csrf, "content": too_long})
    assert refused.status_code == 422 and f"content: at most 4000 characters, this has {len(too_long)}" in refused.text
    assert f">{too_long}</textarea>" in refused.text  # nothing the person typed is lost
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM distillation_versions WHERE distillation_id = %s",
                            (seeded.alice.distillation_id,)).fetchone()[0] == 1
    assert client.post("/ui/u/alice/memories", data={"csrf_token": "forged", "content": "I like figs."}).status_code == 403

    added = client.post("/ui/u/alice/memories", data={"csrf_token": csrf,
                                                      "content": "User: I keep bees.\r\nAssistant: How many hives?"})
    assert _flash(client, added) == "added: recallable now; the pipeline distils it next"
    with database.connection() as conn:
        content, actor = conn.execute("SELECT content, m.source FROM memories m WHERE content LIKE '%%bees%%'").fetchone()
    assert content == "User: I keep bees.\nAssistant: How many hives?" and actor == "api"  # CRLF as the CLI's \n
    again = client.post("/ui/u/alice/memories", data={"csrf_token": csrf,
                                                      "content": "User: I keep bees.\nAssistant: How many hives?"})
    assert _flash(client, again).startswith("already stored on ")
    # A text the user forgot softly (kept, hidden) cannot come back: the page says why and keeps the draft.
    assert forget_memory(database, seeded.alice.memory_id, user_id="alice", actor="test", soft=True) is not None
    forgotten = "User: My locker code is AZURE-7731.\nAssistant: Noted."
    back = client.post("/ui/u/alice/memories", data={"csrf_token": csrf, "content": forgotten})
    assert back.status_code == 409 and "forgot this exchange" in back.text and "AZURE-7731" in back.text


def test_notes_speak_plainly(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001, F811
    client, csrf = signed_in(app, seeded.alice_key)
    target = f"/ui/u/alice/d/{seeded.alice.distillation_id}/weight"
    assert _flash(client, client.post(target, data={"csrf_token": csrf, "user_weight": "2"})) == \
        "pinned: this memory counts twice as much in recall"
    assert _flash(client, client.post(target, data={"csrf_token": csrf, "user_weight": "3.5"})) == \
        "pinned: this memory counts 3.5 times as much in recall"
    assert _flash(client, client.post(target, data={"csrf_token": csrf, "user_weight": "1"})) == \
        "unpinned: this memory counts as much as any other in recall"
    tier = client.post(f"/ui/u/alice/d/{seeded.alice.distillation_id}/tier", data={"csrf_token": csrf, "tier": "low"})
    assert re.fullmatch(r"tier is low now \(was (core|medium)\)", _flash(client, tier))
    assert client.post(f"/ui/u/alice/d/{seeded.alice.distillation_id}/tier",
                       data={"csrf_token": csrf, "tier": "urgent"}).status_code == 422
    for memory in ("User: one fig note\nAssistant: ok", "User: two fig notes\nAssistant: ok"):
        client.post("/ui/u/alice/memories", data={"csrf_token": csrf, "content": memory})
    asked = client.post("/ui/u/alice/forget", data={"csrf_token": csrf, "phrase": "fig note"})
    token = re.search(r'name="token" value="([^"]+)"', asked.text).group(1)
    assert _flash(client, client.post("/ui/u/alice/forget/confirm", data={"csrf_token": csrf, "token": token})) == \
        "forgot 2 memories"
    memory_id = seeded.alice.memory_id
    note = _flash(client, client.post(f"/ui/u/alice/m/{memory_id}/forget", data={"csrf_token": csrf}))
    assert re.fullmatch(rf"forgot memory {memory_id} and \d+ distillations? made from it", note)
    assert "(s)" not in note and "(ies)" not in note


def test_wording_counts_in_words_and_says_what_a_pin_means() -> None:
    assert [plural(n, "memory", "memories") for n in (0, 1, 3)] == ["0 memories", "1 memory", "3 memories"]
    assert plural(1, "distillation") == "1 distillation" and plural(2, "distillation") == "2 distillations"
    assert weight_note(1, 2) == "pinned: this memory counts twice as much in recall"
    assert weight_note(None, 0.5) == "weighted down: this memory counts 0.5 times as much in recall"
    assert weight_note(2, 2) == "unchanged: this memory already counts twice as much in recall"


def test_the_cli_speaks_as_the_page_does(run, seeded: Seeded) -> None:  # noqa: ANN001, F811
    pinned = run("distill", "pin", seeded.alice.distillation_id)
    assert pinned.exit_code == 0, pinned.stdout
    assert pinned.stdout.strip() == f"{seeded.alice.distillation_id} pinned: this memory counts twice as much in recall"
    deleted = run("memory", "delete", seeded.alice.memory_id)
    assert deleted.exit_code == 0, deleted.stdout
    assert re.fullmatch(rf"forgot memory {seeded.alice.memory_id} and \d+ distillations? made from it",
                        " ".join(deleted.stdout.split()))


def test_the_api_and_the_cli_set_the_tier_through_the_same_service(app, run, seeded: Seeded,  # noqa: ANN001, F811
                                                                   database: Database) -> None:
    target = seeded.alice.distillation_id  # seeded as core
    with client_with(app, seeded.alice_key) as alice:
        changed = alice.post(f"/api/distillations/{target}/tier", json={"tier": "low"})
        assert changed.status_code == 200 and changed.json()["tier"] == "low"
        assert alice.post(f"/api/distillations/{target}/tier", json={"tier": "urgent"}).status_code == 422
        bobs = alice.post(f"/api/distillations/{seeded.bob.distillation_id}/tier", json={"tier": "low"})
        assert bobs.status_code == 404  # another user's id is not found for Alice's key
    done = run("distill", "tier", target, "medium")
    assert done.exit_code == 0 and done.stdout.strip() == f"{target} tier medium", done.stdout
    with database.connection() as conn:
        details = [d for _, d in _audit(conn, "tier", target)]
        bob_tier = conn.execute("SELECT tier FROM distillations WHERE id = %s", (seeded.bob.distillation_id,)).fetchone()
    assert details == [{"before": "core", "after": "low"}, {"before": "low", "after": "medium"}]
    assert bob_tier == ("core",)


def test_an_edit_the_embedder_cannot_embed_is_not_saved_and_not_lost(api_settings: Settings, seeded: Seeded,  # noqa: F811
                                                                     database: Database) -> None:
    # Nothing listens on the discard port: the embedder fails at once, as an endpoint that is down.
    down = OpenAIEmbedder(base_url="http://127.0.0.1:9/v1", model="m", dimensions=384, timeout_seconds=1,
                          max_retries=0)
    client, csrf = signed_in(create_app(api_settings, database=database, embedder=down), ADMIN_KEY)
    typed = "The user's locker code changed to AZURE-9000."
    answer = client.post(f"/ui/u/alice/d/{seeded.alice.distillation_id}/text", data={"csrf_token": csrf,
                                                                                     "content": typed})
    assert answer.status_code == 503 and "not saved, the embedder failed: embedding endpoint failed" in answer.text
    assert f">{typed}</textarea>" in answer.text.replace("&#39;", "'")
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM distillation_versions WHERE distillation_id = %s",
                            (seeded.alice.distillation_id,)).fetchone()[0] == 1


def test_the_api_and_the_cli_say_which_distillation_is_superseded(app, run, database: Database) -> None:  # noqa: ANN001, F811
    with database.connection() as conn:
        _, lisbon = seed_memory_with_distillation(conn, user_id="maria", exchange="User: I live in Lisbon.",
                                                  distillation="The user lives in Lisbon.",
                                                  occurred_at=NOW - timedelta(days=30))
        _, porto = seed_memory_with_distillation(conn, user_id="maria", exchange="User: I moved to Porto.",
                                                 distillation="The user lives in Porto.",
                                                 occurred_at=NOW - timedelta(days=2))
        mark_superseded_by_newer(conn, lisbon, porto, actor="test", user_id="maria")
    with client_with(app, ADMIN_KEY) as admin:
        listed = admin.get("/api/distillations", params={"user_id": "maria", "status": "active"}).json()["items"]
        shown = admin.get(f"/api/distillations/{lisbon}").json()
    assert {d["content"]: d["superseded_by"] for d in listed} == {"The user lives in Lisbon.": str(porto),
                                                                  "The user lives in Porto.": None}
    assert shown["superseded_by"] == str(porto)
    # The active memories a client counts from the API (status active, not superseded) are MEMORY.md's.
    assert len([d for d in listed if d["superseded_by"] is None]) == memory_markdown(database, "maria")[1] == 1
    printed = run("distill", "show", str(lisbon))
    assert printed.exit_code == 0 and f"superseded by {porto}" in " ".join(printed.stdout.split())


def test_a_memory_added_with_the_day_it_was_said(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001, F811
    client, csrf = signed_in(app, seeded.alice_key)
    added = client.post("/ui/u/alice/memories", data={"csrf_token": csrf, "content": "I moved to Utrecht.",
                                                      "said_on": "2026-05-03"})
    assert _flash(client, added) == "added: recallable now; the pipeline distils it next"
    with database.connection() as conn:
        said = conn.execute("SELECT occurred_at FROM memories WHERE content = 'I moved to Utrecht.'").fetchone()[0]
    assert said == datetime(2026, 5, 3, 12, tzinfo=UTC)  # noon of that day in Yak's zone (UTC here)
    for day, reason in (("1999-12-31", "said on: is before 2000-01-01"),
                        ("03/05/2026", "said on: '03/05/2026' is not a date (YYYY-MM-DD)")):
        refused = client.post("/ui/u/alice/memories", data={"csrf_token": csrf, "content": "I moved to Delft.",
                                                            "said_on": day})
        assert refused.status_code == 422 and reason in refused.text.replace("&#39;", "'"), refused.text[-800:]
        assert ">I moved to Delft.</textarea>" in refused.text and f'value="{day}"' in refused.text
