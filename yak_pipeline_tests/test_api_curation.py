"""Curating through the API: versions, merges, re-embeds, the review queue, conflicts, warmth resets."""

from __future__ import annotations

import pytest

from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import Seeded, admin, api_settings, app, client_with, seeded  # noqa: F401


def test_manual_version_keeps_the_old_text(admin, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    target = seeded.alice.distillation_id
    response = admin.post(f"/api/distillations/{target}/versions", json={"content": "The locker code changed."})
    assert response.status_code == 201
    detail = response.json()
    assert detail["content"] == "The locker code changed."
    assert [(v["version"], v["reason"]) for v in detail["versions"]] == [(1, "distilled"), (2, "manual")]
    assert detail["versions"][0]["content"] == "The user's locker code is AZURE-7731."
    with database.connection() as conn:
        actor = conn.execute("SELECT actor FROM audit_log WHERE action = 'version'").fetchone()[0]
    assert actor == "api:admin"
    blank = admin.post(f"/api/distillations/{target}/versions", json={"content": "  "})
    assert blank.status_code == 422 and blank.json()["errors"][0]["field"] == "content"


def test_merge_two_distillations(admin, seeded: Seeded) -> None:  # noqa: ANN001
    a = seeded.alice
    merged = admin.post("/api/distillations/merge", json={"keep_id": a.distillation_id,
                                                          "merge_id": a.other_distillation_id})
    assert merged.status_code == 200
    detail = merged.json()
    assert detail["versions"][-1]["reason"] == "merged"
    assert detail["versions"][-1]["merged_from"] == [a.other_distillation_id]
    assert admin.get(f"/api/distillations/{a.other_distillation_id}").json()["status"] == "merged"
    again = admin.post("/api/distillations/merge", json={"keep_id": a.distillation_id,
                                                         "merge_id": a.other_distillation_id})
    assert again.status_code == 409
    across = admin.post("/api/distillations/merge", json={"keep_id": a.distillation_id,
                                                          "merge_id": seeded.bob.distillation_id})
    assert across.status_code == 422 and "different users" in across.json()["detail"]
    itself = admin.post("/api/distillations/merge", json={"keep_id": a.distillation_id, "merge_id": a.distillation_id})
    assert itself.status_code == 422


def test_reembed_keeps_text_and_versions(admin, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    target = seeded.alice.distillation_id
    with database.connection() as conn:
        conn.execute("UPDATE distillations SET embedding_model = 'old-model' WHERE id = %s", (target,))
    response = admin.post(f"/api/distillations/{target}/re-embed")
    assert response.status_code == 200
    assert response.json()["embedding_model"] == "feature-hashing-384"
    assert len(response.json()["versions"]) == 1
    with database.connection() as conn:
        version_model = conn.execute("SELECT embedding_model FROM distillation_versions WHERE distillation_id = %s",
                                     (target,)).fetchone()[0]
    assert version_model == "feature-hashing-384"


def test_review_queue_approve_and_reject(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    alice = client_with(app, seeded.alice_key)
    queue = alice.get("/api/review").json()
    assert {i["id"] for i in queue} == {seeded.alice.distillation_id, seeded.alice.other_distillation_id,
                                        seeded.alice.review_id}
    held = next(i for i in queue if i["id"] == seeded.alice.review_id)
    assert held["status"] == "review" and held["confidence"] == 0.5 and not held["in_conflict"]

    approved = alice.post(f"/api/review/{seeded.alice.review_id}/approve")
    assert approved.json() == {"id": seeded.alice.review_id, "decision": "approved"}
    with database.connection() as conn:
        row = conn.execute("SELECT status, needs_review, confidence FROM distillations WHERE id = %s",
                           (seeded.alice.review_id,)).fetchone()
        audit = conn.execute("SELECT detail FROM audit_log WHERE action = 'approve'").fetchone()[0]
    assert row == ("active", False, 0.8)
    assert audit["confidence"] == 0.5
    assert alice.post(f"/api/review/{seeded.alice.review_id}/approve").status_code == 409

    rejected = alice.post(f"/api/review/{seeded.alice.other_distillation_id}/reject")
    assert rejected.json()["decision"] == "rejected"
    assert alice.get(f"/api/distillations/{seeded.alice.other_distillation_id}").json()["status"] == "rejected"
    assert [i["id"] for i in alice.get("/api/review").json()] == [seeded.alice.distillation_id]


def test_conflicts_list_resolve_and_dismiss(app, seeded: Seeded) -> None:  # noqa: ANN001
    alice = client_with(app, seeded.alice_key)
    conflicts = alice.get("/api/conflicts").json()
    assert [c["id"] for c in conflicts] == [seeded.alice.conflict_id]
    assert {conflicts[0]["content_a"], conflicts[0]["content_b"]} == {
        "The user's locker code is AZURE-7731.", "The user's locker code is not AZURE-7731."}
    resolved = alice.post(f"/api/conflicts/{seeded.alice.conflict_id}/resolve", json={"resolution": "kept the first"})
    assert resolved.json() == {"id": seeded.alice.conflict_id, "status": "resolved"}
    assert alice.get("/api/conflicts").json() == []
    closed = alice.get("/api/conflicts", params={"status": "resolved"}).json()
    assert closed[0]["resolution"] == "kept the first"
    assert alice.post(f"/api/conflicts/{seeded.alice.conflict_id}/dismiss").status_code == 404
    bob = client_with(app, seeded.bob_key)
    assert bob.post(f"/api/conflicts/{seeded.bob.conflict_id}/dismiss").json()["status"] == "dismissed"


def test_warmth_reset_and_bulk_reset(admin, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    target = seeded.alice.distillation_id
    assert admin.get(f"/api/warmth/{target}").json()["warmth"] == pytest.approx(0.6)
    reset = admin.post(f"/api/warmth/{target}/reset").json()
    assert reset["warmth"] == 0.5 and reset["history"][0]["reason"] == "reset"
    with database.connection() as conn:
        conn.execute("UPDATE distillations SET warmth = 0.9 WHERE user_id IN ('alice', 'bob')")
    bulk = admin.post("/api/warmth/bulk-reset", json={"user_id": "alice"})
    assert bulk.json() == {"reset": 3}
    with database.connection() as conn:
        warmth = dict(conn.execute("SELECT user_id, max(warmth) FROM distillations GROUP BY user_id").fetchall())
    assert warmth == {"alice": 0.5, "bob": 0.9}
    only = admin.post("/api/warmth/bulk-reset", json={"user_id": "bob", "memory_ids": [seeded.bob.distillation_id]})
    assert only.json() == {"reset": 1}
