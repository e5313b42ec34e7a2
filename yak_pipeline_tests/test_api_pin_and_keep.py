"""Pinning a memory (``user_weight``) and settling a conflict by keeping a side: API and CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from yak_pipeline.cli.main import app as yak
from yak_pipeline.cli.parts import CliParts
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import Seeded, admin, api_settings, app, client_with, seeded  # noqa: F401


def _row(database: Database, distillation_id: str) -> tuple:
    with database.connection() as conn:
        return conn.execute("SELECT status, needs_review, user_weight FROM distillations WHERE id = %s",
                            (distillation_id,)).fetchone()


def _sides(database: Database, conflict_id: str) -> tuple[str, str]:
    with database.connection() as conn:
        return conn.execute("SELECT distillation_a::text, distillation_b::text FROM conflicts WHERE id = %s",
                            (conflict_id,)).fetchone()


def test_pin_sets_user_weight_and_recall_weighs_it(app, admin, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    target = seeded.alice.distillation_id  # a core memory: gravity = 2 × user_weight
    search = {"query": "locker code AZURE-7731", "user_id": "alice", "threshold": 0.0, "explain": True}
    before = next(h for h in admin.post("/api/distillations/search", json=search).json() if h["id"] == target)
    pinned = admin.post(f"/api/distillations/{target}/weight", json={"user_weight": 3})
    assert pinned.status_code == 200 and pinned.json()["user_weight"] == 3.0
    after = next(h for h in admin.post("/api/distillations/search", json=search).json() if h["id"] == target)
    assert (before["explain"]["gravity"], after["explain"]["gravity"]) == (2.0, 6.0)
    assert after["rank_odds"] == pytest.approx(before["rank_odds"] * 3, rel=1e-6)
    assert 0.0 <= before["score"] <= after["score"] <= 1.0  # the shown score: the same order, in [0, 1]
    with database.connection() as conn:
        detail = conn.execute("SELECT actor, detail FROM audit_log WHERE action = 'weight'").fetchone()
    assert detail == ("api:admin", {"before": 1.0, "after": 3.0})
    for bad in (0, -1, 10.5):
        refused = admin.post(f"/api/distillations/{target}/weight", json={"user_weight": bad})
        assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "user_weight"
    bob = client_with(app, seeded.bob_key)
    assert bob.post(f"/api/distillations/{target}/weight", json={"user_weight": 2}).status_code == 404
    assert _row(database, target)[2] == 3.0


def test_keep_one_side_rejects_the_other(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    alice = client_with(app, seeded.alice_key)
    conflict = seeded.alice.conflict_id
    side_a, side_b = _sides(database, conflict)
    assert client_with(app, seeded.bob_key).post(f"/api/conflicts/{conflict}/keep", json={"keep": "a"}).status_code == 404
    kept = alice.post(f"/api/conflicts/{conflict}/keep", json={"keep": "b", "resolution": "moved"})
    assert kept.json() == {"id": conflict, "status": "resolved"}
    assert _row(database, side_b)[:2] == ("active", False)
    assert _row(database, side_a)[:2] == ("rejected", False)
    listed = alice.get("/api/conflicts", params={"status": "resolved"}).json()
    assert [(c["id"], c["resolution"]) for c in listed] == [(conflict, "moved")]
    assert alice.post(f"/api/conflicts/{conflict}/keep", json={"keep": "a"}).status_code == 404  # closed already
    assert alice.post(f"/api/conflicts/{conflict}/keep", json={"keep": "neither"}).status_code == 422


def test_keep_both_confirms_both(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    alice = client_with(app, seeded.alice_key)
    assert alice.post(f"/api/conflicts/{seeded.alice.conflict_id}/keep", json={"keep": "both"}).status_code == 200
    for side in _sides(database, seeded.alice.conflict_id):
        assert _row(database, side)[:2] == ("active", False)
    assert alice.get("/api/conflicts").json() == []
    assert not {seeded.alice.distillation_id, seeded.alice.other_distillation_id} & {
        i["id"] for i in alice.get("/api/review").json()}


def test_cli_pin_and_keep(settings: Settings, seeded: Seeded, database: Database) -> None:
    runner = CliRunner()

    def invoke(args: list[str]):  # noqa: ANN202 - click's Result
        # A fresh command's parts each time, as each `yak` process would have.
        return runner.invoke(yak, args, obj=CliParts.of(settings))

    pinned = invoke(["distill", "pin", seeded.bob.distillation_id, "--json"])
    assert pinned.exit_code == 0, pinned.stderr
    assert json.loads(pinned.stdout)["user_weight"] == 2.0
    unpinned = invoke(["distill", "pin", seeded.bob.distillation_id, "--weight", "1"])
    assert unpinned.exit_code == 0 and "unpinned: this memory counts as much as any other in recall" in unpinned.stdout
    kept = invoke(["conflicts", "keep", seeded.bob.conflict_id, "both"])
    assert kept.exit_code == 0 and "resolved (kept both)" in kept.stdout
    again = invoke(["conflicts", "keep", seeded.bob.conflict_id, "both"])
    assert again.exit_code == 1 and "no open conflict" in again.stderr
    assert invoke(["conflicts", "keep", seeded.bob.conflict_id, "c"]).exit_code == 2
