"""Isolation and forget (issue 6 §6), through the real API app on the test's PostgreSQL database.

- Every operation the OpenAPI document lists is classified here: a route added later without an
  isolation case fails this test. With Alice's user-scoped key, every route that takes an id
  answers 404 for Bob's ids (403 for admin-only routes) and changes none of his rows; every
  listing, search and context answer is free of Bob's text.
- A property test runs random sequences of ingest / merge / turn / conflict / forget (by id, by
  phrase, all of a user's memories; soft and hard) for Alice while Bob holds the very same texts:
  Bob's row counts never move, and after a forget no read path returns the forgotten text.
"""

from __future__ import annotations

import itertools
import re
import uuid

import psycopg
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.llm.rules import RulesProvider
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.store.conflicts import record_conflict
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import (  # noqa: F401 - fixtures
    ADMIN_KEY,
    Seeded,
    api_settings,
    app,
    client_with,
    seeded,
)
from yak_pipeline_tests.reliability_helpers import report_figure

# Where each id-taking route's path parameter points, and a body when it needs one.
ID_ROUTES = {
    ("get", "/api/memories/{memory_id}"): ("memory_id", None),
    ("delete", "/api/memories/{memory_id}"): ("memory_id", None),
    ("get", "/api/distillations/{distillation_id}"): ("distillation_id", None),
    ("post", "/api/distillations/{distillation_id}/versions"): ("distillation_id", {"content": "Alice wrote this."}),
    ("post", "/api/distillations/{distillation_id}/re-embed"): ("distillation_id", None),
    ("post", "/api/distillations/{distillation_id}/weight"): ("distillation_id", {"user_weight": 5}),
    ("post", "/api/distillations/{distillation_id}/tier"): ("distillation_id", {"tier": "low"}),
    ("post", "/api/distillations/{distillation_id}/type"): ("distillation_id", {"memory_type": "event"}),
    ("get", "/api/warmth/{memory_id}"): ("distillation_id", None),
    ("post", "/api/warmth/{memory_id}/reset"): ("distillation_id", None),
    ("post", "/api/review/{distillation_id}/approve"): ("review_id", None),
    ("post", "/api/review/{distillation_id}/reject"): ("review_id", None),
    ("post", "/api/conflicts/{conflict_id}/resolve"): ("conflict_id", None),
    ("post", "/api/conflicts/{conflict_id}/dismiss"): ("conflict_id", None),
    ("post", "/api/conflicts/{conflict_id}/keep"): ("conflict_id", {"keep": "a"}),
}
# Routes that take ids in the body: Bob's ids in Alice's name.
BODY_ID_ROUTES = {
    ("post", "/api/distillations/merge"): lambda s: {"keep_id": s.bob.distillation_id,
                                                     "merge_id": s.bob.other_distillation_id, "content": "Merged."},
    ("post", "/api/warmth/evaluate"): lambda s: {"memory_id": s.bob.distillation_id, "context": "User: hi\nAssistant: hi"},
    ("post", "/api/forget"): lambda s: {"command": f"/forget {s.bob.memory_id}", "user_id": "alice"},
}
# Routes that read: Alice's answers must hold none of Bob's text.
READ_ROUTES = {
    ("get", "/api/memories"): None,
    ("get", "/api/distillations"): None,
    ("get", "/api/review"): None,
    ("get", "/api/conflicts"): None,
    ("get", "/api/queue"): None,
    ("get", "/api/export/memory.md"): None,
    ("post", "/api/distillations/search"): {"query": "locker code CRIMSON-4402", "user_id": "alice", "threshold": 0.0,
                                            "limit": 100},
    ("post", "/api/context"): {"query": "what is my locker code CRIMSON", "user_id": "alice", "threshold": 0.0,
                               "limit": 100},
    ("post", "/api/forget/confirm"): {"token": "x" * 32, "user_id": "alice"},
    ("get", "/api/profile"): None,
}
# Routes that write only the caller's own rows (checked in the property test; the profile's drop by
# test_profile.py) or need no user.
OWN_WRITE_ROUTES = {("post", "/api/memories/"), ("post", "/api/turns"), ("post", "/api/warmth/bulk-reset"),
                    ("post", "/api/profile/drop")}
ADMIN_ROUTES = {("post", "/api/keys"), ("get", "/api/keys"), ("delete", "/api/keys/{key_id}"), ("get", "/metrics")}
PUBLIC_ROUTES = {("get", "/health")}


def _bob_counts(database: Database) -> dict[str, int]:
    """Bob's rows in every table that has a user."""
    with database.connection() as conn:
        tables = [r[0] for r in conn.execute(
            """SELECT table_name FROM information_schema.columns
               WHERE table_schema = 'public' AND column_name = 'user_id' ORDER BY 1""").fetchall()]
        counts = {t: conn.execute(f'SELECT count(*) FROM "{t}" WHERE user_id = %s', ("bob",)).fetchone()[0]  # noqa: S608
                  for t in tables}
        counts["distillation_versions"] = conn.execute(
            "SELECT count(*) FROM distillation_versions v JOIN distillations d ON d.id = v.distillation_id "
            "WHERE d.user_id = 'bob'").fetchone()[0]
        counts["bob_text"] = conn.execute(
            "SELECT md5(string_agg(content || status || user_weight, ',' ORDER BY id)) FROM distillations WHERE user_id = 'bob'"
        ).fetchone()[0]
    return counts


def test_every_route_keeps_a_user_key_to_its_own_user(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    operations = {(method, path) for path, methods in app.openapi()["paths"].items() for method in methods}
    classified = set(ID_ROUTES) | set(BODY_ID_ROUTES) | set(READ_ROUTES) | OWN_WRITE_ROUTES | ADMIN_ROUTES | PUBLIC_ROUTES
    assert operations == classified, f"unclassified routes: {operations - classified}; gone: {classified - operations}"

    alice = client_with(app, seeded.alice_key)
    bob_before = _bob_counts(database)
    for (method, path), (kind, body) in ID_ROUTES.items():
        url = path.replace(path[path.index("{"): path.index("}") + 1], getattr(seeded.bob, kind))
        response = alice.request(method.upper(), url, json=body)
        assert response.status_code == 404, (method, url, response.text)
        assert seeded.bob.secret not in response.text
    for (method, path), body in BODY_ID_ROUTES.items():
        response = alice.request(method.upper(), path, json=body(seeded))
        assert response.status_code == 404, (method, path, response.text)
        assert seeded.bob.secret not in response.text
    for (method, path), body in READ_ROUTES.items():
        response = alice.request(method.upper(), path, json=body,
                                 params={"status": "all"} if path == "/api/conflicts" else
                                 {"user_id": "alice"} if path == "/api/profile" else None)
        assert response.status_code in (200, 404), (method, path, response.text)
        assert seeded.bob.secret not in response.text and '"bob"' not in response.text, (method, path)
    for method, path in sorted(ADMIN_ROUTES):
        url = path.replace("{key_id}", str(uuid.uuid4()))
        response = alice.request(method.upper(), url, json={"user_id": "alice"} if method == "post" else None)
        assert response.status_code == 403, (method, url, response.text)
    assert _bob_counts(database) == bob_before
    # The same answers for Bob's own key show it is his data that was hidden, not an empty database.
    bob = client_with(app, seeded.bob_key)
    assert seeded.bob.secret in bob.get(f"/api/memories/{seeded.bob.memory_id}").text
    report_figure("Isolation", f"{len(operations)} operations classified; {len(ID_ROUTES) + len(BODY_ID_ROUTES)} "
                  f"id routes 404 for another user's ids, {len(READ_ROUTES)} read routes free of their text, "
                  f"{len(ADMIN_ROUTES)} admin routes 403; the other user's rows unchanged")


# --- forget, as a property --------------------------------------------------------------------------

_examples = itertools.count()
operations = st.lists(st.tuples(st.sampled_from(["ingest", "ingest", "merge", "turn", "conflict", "forget_id",
                                                 "forget_phrase", "forget_all"]),
                                st.integers(0, 50), st.booleans()),
                      min_size=2, max_size=12)


def _distil_pending(database: Database) -> None:
    with database.connection() as conn:
        pending = [str(r[0]) for r in conn.execute("SELECT id FROM memories WHERE status = 'pending'").fetchall()]
    distill_memories(DistillJob(db=database, llm=RulesProvider(), embedder=HashingEmbedder(384), prompt_version="v1"),
                     pending)


def _read_everything(client, user: str, token: str) -> list[tuple[str, str]]:  # noqa: ANN001
    """Every read path's answer for ``user`` that could show ``token``: (where, text)."""
    answers = []

    def get(path: str, **params: object) -> str:
        response = client.get(path, params=params or None)
        assert response.status_code == 200, (path, response.text)
        answers.append((path, response.text))
        return response.text

    def post(path: str, body: dict) -> str:
        response = client.post(path, json=body)
        # A search for a user with no memories left (all forgotten) names that instead of answering [].
        no_memories = response.status_code == 404 and response.json() == {"detail": f"user {user!r} has no memories"}
        assert response.status_code == 200 or no_memories, (path, response.text)
        answers.append((path, response.text))
        return response.text

    memories = client.get("/api/memories", params={"user_id": user, "limit": 500}).json()["items"]
    answers.append(("/api/memories", str(memories)))
    for m in memories:
        get(f"/api/memories/{m['id']}")
    for d in client.get("/api/distillations", params={"user_id": user, "limit": 500}).json()["items"]:
        get(f"/api/distillations/{d['id']}")  # with every version
        get(f"/api/warmth/{d['id']}")
    get("/api/distillations", user_id=user, limit=500)
    get("/api/review", user_id=user, limit=500)
    get("/api/conflicts", user_id=user, status="all", limit=500)
    get("/api/queue", user_id=user)
    post("/api/distillations/search", {"query": token, "user_id": user, "threshold": 0.0, "limit": 100})
    context = client.post("/api/context", json={"query": token, "user_id": user, "threshold": 0.0, "limit": 100})
    assert context.status_code == 200, context.text
    answers.append(("/api/context block", context.json()["block"]))  # (the messages echo the query itself)
    forget = post("/api/forget", {"command": f"/forget {token}", "user_id": user})
    answers = [(where, text) for where, text in answers if token in text and where != "/api/forget"]
    if '"action":"confirm"' in forget:
        answers.append(("/api/forget phrase candidates", forget))
    return answers


@hypothesis_settings(max_examples=15, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=operations)
def test_after_any_sequence_of_ingest_merge_and_forget_no_read_path_returns_forgotten_text(
        app, seeded: Seeded, database: Database, ops: list[tuple[str, int, bool]]) -> None:  # noqa: ANN001
    example = next(_examples)
    alice, bob = client_with(app, seeded.alice_key), client_with(app, seeded.bob_key)
    admin = client_with(app, ADMIN_KEY)
    live: list[dict] = []  # alice's: token, memory id, distillation id
    forgotten: list[str] = []
    for step, (op, pick, soft) in enumerate(ops):
        if op == "ingest" or (not live and op != "forget_all"):
            token = f"word{example}x{step}q{uuid.uuid4().hex[:6]}"
            content = f"User: My favourite word is {token}.\nAssistant: Noted."
            for client, user in ((alice, "alice"), (bob, "bob")):  # Bob says the very same thing
                assert client.post("/api/memories/", json={"user_id": user, "content": content}).status_code == 201
            _distil_pending(database)
            memory = alice.get("/api/memories", params={"limit": 1}).json()["items"][0]
            detail = alice.get(f"/api/memories/{memory['id']}").json()
            assert token in detail["distillations"][0]["content"]  # so the read-path checks can find it
            live.append({"token": token, "memory": memory["id"], "distillation": detail["distillations"][0]["id"]})
        elif op == "merge" and len(live) >= 2:
            keep, merge = live[pick % len(live)], live[(pick + 1) % len(live)]
            response = alice.post("/api/distillations/merge", json={
                "keep_id": keep["distillation"], "merge_id": merge["distillation"],
                "content": f"User's favourite words are {keep['token']} and {merge['token']}."})
            assert response.status_code in (200, 404, 409), response.text  # 409/404: one side merged or gone
        elif op == "turn" and live:
            recalled = [e["distillation"] for e in live[: pick % len(live) + 1]]
            response = alice.post("/api/turns", json={"user_id": "alice", "user_message": f"Which word {step}?",
                                                      "assistant_message": f"It is {live[0]['token']}.",
                                                      "recalled_ids": recalled})
            assert response.status_code == 202
        elif op == "conflict" and len(live) >= 2:
            a, b = live[pick % len(live)]["distillation"], live[(pick + 1) % len(live)]["distillation"]
            if a != b:
                with database.connection() as conn:
                    try:
                        record_conflict(conn, user_id="alice", a=a, b=b, score=0.9)
                    except psycopg.Error:
                        conn.rollback()
        elif op.startswith("forget") and live:
            before = _bob_counts(database)
            if op == "forget_all":
                ids = [m["id"] for m in alice.get("/api/memories", params={"limit": 500}).json()["items"]]
                response = alice.post("/api/forget", json={"command": "/forget " + " ".join(ids), "user_id": "alice",
                                                           "soft": soft})
                gone, live = live, []
            elif op == "forget_id":
                entry = live.pop(pick % len(live))
                response = alice.post("/api/forget", json={"command": f"delete memory: {entry['memory']}",
                                                           "user_id": "alice", "soft": soft})
                gone = [entry]
            else:
                entry = live.pop(pick % len(live))
                asked = alice.post("/api/forget", json={"command": f"/forget {entry['token']}", "user_id": "alice"})
                assert asked.json()["action"] == "confirm", asked.text
                candidates = {c["memory_id"] for c in asked.json()["candidates"]}
                assert entry["memory"] in candidates
                response = alice.post("/api/forget/confirm", json={"token": asked.json()["confirmation_token"],
                                                                   "user_id": "alice", "soft": soft})
                # A phrase may match merged text of other memories too: they go with it.
                gone = [entry] + [e for e in live if e["memory"] in candidates]
                live = [e for e in live if e["memory"] not in candidates]
            assert response.status_code == 200 and response.json()["action"] == "deleted", response.text
            forgotten += [e["token"] for e in gone]
            assert _bob_counts(database) == before  # Bob's rows are never touched
    for token in forgotten:
        assert _read_everything(alice, "alice", token) == []
        assert _read_everything(admin, "alice", token) == []
        assert [w for w, _ in _read_everything(bob, "bob", token)] != []  # Bob's copy is still there
    for entry in live:  # what was not forgotten is still found (merged text counts)
        assert _read_everything(alice, "alice", entry["token"]) != []


def test_forget_figure(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    """Forget one and then all of a user's memories; the other user's counts, before and after."""
    alice = client_with(app, seeded.alice_key)
    before = _bob_counts(database)
    one = alice.post("/api/forget", json={"command": f"/forget {seeded.alice.memory_id}", "user_id": "alice"})
    assert one.status_code == 200 and one.json()["deleted_memory_ids"] == [seeded.alice.memory_id]
    ids = [m["id"] for m in alice.get("/api/memories", params={"limit": 500}).json()["items"]]
    everything = alice.post("/api/forget", json={"command": "/forget " + " ".join(ids), "user_id": "alice"})
    assert everything.status_code == 200 and sorted(everything.json()["deleted_memory_ids"]) == sorted(ids)
    after = _bob_counts(database)
    assert after == before
    with database.connection() as conn:
        left = conn.execute("SELECT count(*) FROM memories WHERE user_id = 'alice'").fetchone()[0]
    assert left == 0 and re.search(seeded.alice.secret, str(alice.get("/api/distillations").json())) is None
    report_figure("Forget isolation", f"forgot 1 then all {len(ids) + 1} of one user's memories: the other user's "
                  f"rows before/after {before['memories']}/{after['memories']} memories, "
                  f"{before['distillations']}/{after['distillations']} distillations, "
                  f"{before['distillation_versions']}/{after['distillation_versions']} versions, "
                  f"{before['turns']}/{after['turns']} turns, {before['warmth_events']}/{after['warmth_events']} "
                  f"warmth events, {before['conflicts']}/{after['conflicts']} conflicts")
