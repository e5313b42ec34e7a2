"""The LoCoMo evaluation: the loader, the metrics, and a whole run on small synthetic data."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from yak_loopback.openai_replies import Reply, rules_replier
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.eval.ingest import user_id_for
from yak_pipeline.eval.locomo import (
    LocomoFormatError,
    load_locomo,
    parse_evidence,
    parse_locomo,
    parse_session_datetime,
)
from yak_pipeline.eval.metrics import ScoredQuestion, aggregate, score_ranking
from yak_pipeline.eval.options import EvalOptions
from yak_pipeline.eval.runner import run_locomo_eval
from yak_pipeline.llm.prompts import parse_payload
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import connect


def _turn(speaker: str, dia_id: str, text: str, **extra: str) -> dict:
    return {"speaker": speaker, "dia_id": dia_id, "text": text, **extra}


def synthetic_locomo() -> list[dict]:
    """Two small conversations in LoCoMo format, with questions of every category."""
    first = {
        "sample_id": "conv-a",
        "conversation": {
            "speaker_a": "Ana", "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                _turn("Ana", "D1:1", "Hi Ben! I adopted a grey kitten called Miso yesterday."),
                _turn("Ben", "D1:2", "Lovely! I started pottery classes at the community centre."),
                _turn("Ana", "D1:3", "I work as a nurse at the children's hospital now."),
                _turn("Ben", "D1:4", "Here is my first bowl.", blip_caption="a photo of a blue ceramic bowl"),
            ],
            "session_2_date_time": "10:37 am on 27 June, 2023",
            "session_2": [
                _turn("Ana", "D2:1", "Miso knocked my coffee over this morning, cheeky cat."),
                _turn("Ben", "D2:2", "I ran my first half marathon in Leeds last Sunday."),
                _turn("Ana", "D2:3", "Congratulations! I am training for a triathlon in September."),
            ],
        },
        "qa": [
            {"question": "What is the name of Ana's kitten?", "answer": "Miso", "evidence": ["D1:1"], "category": 4,
             "ability": "information_extraction"},
            {"question": "Where did Ben run a half marathon?", "answer": "Leeds", "evidence": ["D2:2"], "category": 2,
             "ability": "information_extraction"},
            {"question": "What sports is Ana training for?", "answer": "triathlon", "evidence": ["D2:3; D1:3"],
             "category": 1},
            {"question": "What did Ben make in pottery class?", "answer": "a bowl", "evidence": ["D1:4", "D:1:2"],
             "category": 3},
            {"question": "What is Ben's kitten called?", "adversarial_answer": "Miso", "evidence": ["D1:1"],
             "category": 5},
            {"question": "Nothing to find here", "answer": "x", "evidence": ["D9:9"], "category": 4},
        ],
    }
    second = {
        "conversation": {
            "speaker_a": "Cy", "speaker_b": "Di",
            "session_1_date_time": "7:31 pm on 21 January, 2022",
            "session_1": [
                _turn("Cy", "D1:1", "I moved to Lisbon for a new job in design."),
                _turn("Di", "D1:2", "I bake sourdough bread every weekend."),
            ],
        },
        "qa": [{"question": "Which city did Cy move to?", "answer": "Lisbon", "evidence": ["D1:1"], "category": 4}],
    }
    return [first, second]


def test_loader_maps_turns_to_dated_exchanges_and_reads_evidence_leniently() -> None:
    conversations = parse_locomo(synthetic_locomo())
    first = conversations[0]
    assert first.sample_id == "conv-a" and conversations[1].sample_id == "conversation-1"
    assert len(first.turns) == 7
    assert first.turns[0].exchange() == "User: Hi Ben! I adopted a grey kitten called Miso yesterday.\nAssistant: (Ana said this.)"
    assert first.turns[3].exchange().startswith("User: Here is my first bowl. [shares a photo: a photo of a blue ceramic bowl]")
    assert first.turns[4].occurred_at == datetime(2023, 6, 27, 10, 37, tzinfo=UTC)
    assert first.last_session_at == datetime(2023, 6, 27, 10, 37, tzinfo=UTC)
    by_text = {q.question: q for q in first.questions}
    assert by_text["What sports is Ana training for?"].evidence == {"D2:3", "D1:3"}
    assert by_text["What did Ben make in pottery class?"].evidence == {"D1:4", "D1:2"}
    assert len(first.questions) == 4
    assert first.skipped == {"adversarial": 1, "other_category": 0, "no_evidence": 1, "unknown_evidence_ids": 1}
    assert parse_evidence(["D8:6; D9:17", "D"]) == ["D8:6", "D9:17"]
    assert parse_session_datetime("12:06 am on 11 November, 2022") == datetime(2022, 11, 11, 0, 6, tzinfo=UTC)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{}", "top level must be a list"),
        ("[]", "holds no conversations"),
        ("[1]", "conversation 0: must be an object"),
        ('[{"qa": []}]', "missing 'conversation'"),
        ('[{"conversation": {"session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"}]}, "qa": []}]',
         "session_1 has no session_1_date_time"),
        ('[{"conversation": {"session_1_date_time": "yesterday", "session_1": [{"speaker": "A", "dia_id": "D1:1", '
         '"text": "hi"}]}, "qa": []}]', "unreadable session date/time"),
        ('[{"conversation": {"session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": [{"speaker": "A", '
         '"text": "hi"}]}, "qa": []}]', "missing 'dia_id'"),
        ("not json", "invalid JSON at line 1"),
        ('[{"conversation": {"session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": [{"speaker": "A", '
         '"dia_id": "D1:1", "text": "hi"}]}, "qa": [{"question": "q", "evidence": ["D1:1"], "category": 1, '
         '"ability": 3}]}]', "'ability' must be a non-empty string"),
    ],
)
def test_bad_files_are_one_line_errors_saying_where(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(LocomoFormatError) as err:
        load_locomo(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(LocomoFormatError, match="no such file"):
        load_locomo(tmp_path / "missing.json")


def test_metrics_count_items_and_credit_merged_items_once() -> None:
    evidence = {"D1:1", "D1:2"}
    ranking = [{"D9:9"}, {"D1:1", "D1:2"}, {"D1:1"}]
    scores = score_ranking(ranking, evidence, (1, 2, 3))
    assert scores["recall@1"] == 0 and scores["hit@1"] == 0
    assert scores["recall@2"] == 1 and scores["hit@2"] == 1
    assert scores["mrr"] == pytest.approx(0.5)
    assert scores["ndcg@2"] == pytest.approx(min(1.0, (2 / 1.5849625007211563) / (1 + 1 / 1.5849625007211563)))
    one = score_ranking([{"D2:1"}, {"D1:1"}], {"D1:1"}, (10,))
    assert one["recall@10"] == 1 and one["mrr"] == 0.5 and one["ndcg@10"] == pytest.approx(1 / 1.5849625007211563)
    assert score_ranking([], {"D1:1"}, (5,))["recall@5"] == 0
    summary = aggregate([ScoredQuestion(1, {"recall@5": 1.0, "hit@5": 1.0, "mrr": 1.0, "ndcg@5": 1.0}),
                         ScoredQuestion(4, {"recall@5": 0.0, "hit@5": 0.0, "mrr": 0.0, "ndcg@5": 0.0})], (5,))
    assert summary["overall"]["recall@5"] == 0.5 and summary["overall"]["n"] == 2
    assert summary["1"]["n"] == 1 and list(summary) == ["overall", "1", "4"]


def _server_databases(url: str) -> set[str]:
    with connect(url, autocommit=True, vector=False) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database")}


def test_a_whole_run_ingests_through_the_pipeline_and_scores_three_methods(settings: Settings, db_url: str,
                                                                          tmp_path: Path) -> None:
    before = _server_databases(db_url)
    lines: list[str] = []
    report = run_locomo_eval(settings, parse_locomo(synthetic_locomo()), EvalOptions(ks=(1, 5), ablations=True),
                             progress=lines.append, data_label="synthetic")
    assert _server_databases(db_url) == before  # its own database, dropped afterwards
    with psycopg.connect(db_url) as conn:  # and the user's database untouched
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 0
    assert any("distilled" in line for line in lines) and any("asked" in line for line in lines)
    assert report["data"] == ["synthetic"] and list(report["files"]) == ["synthetic"]
    section = report["files"]["synthetic"]
    assert list(section["methods"]) == ["BM25", "dense", "Yak", "Yak (in-sample)", "Yak (shipped model)",
                                        "Yak, no query parts", "Yak, no update reading"]
    assert section["questions"]["scored"] == 5 and section["turns"] == 9
    # Two people talking (no assistant): one exchange per turn, as before.
    assert section["exchanges"] == 9 and section["paired_conversations"] == 0
    assert section["pipeline"]["counts"]["memories"] == 9 and section["pipeline"]["llm_provider"] == "rules"
    assert report["distiller"] == "rules" and report["settings"]["distiller"] == "rules"
    # The distiller's figures: who answered each call, how often validly, how fast.
    distil = section["pipeline"]["llm"]["distil"]
    assert distil["models"] == {"rules": 9} and (distil["calls"], distil["requests"], distil["invalid_outputs"]) == (9, 9, 0)
    assert distil["valid_output_rate"] == 1.0 and distil["latency_ms"]["p50"] <= distil["latency_ms"]["p95"]
    bm25 = section["methods"]["BM25"]
    assert bm25["overall"]["n"] == 5 and set(bm25["by_category"]) == {"1", "2", "3", "4"}
    assert bm25["overall"]["hit@5"] == 1.0  # every question shares a rare word with its evidence
    for method in section["methods"].values():
        assert 0.0 <= method["overall"]["recall@5"] <= 1.0 and "mrr" in method["overall"]
    assert {"Yak, decay off", "Yak, no gate"} <= set(section["ablations"])
    assert report["target"]["metric"] == "recall@5" and report["default_method"] == "Yak"
    assert section["target"]["default_method"] == "Yak" and report["target"]["files"]["synthetic"] == section["target"]
    # The synthetic file has no never-said or knowledge-update questions: those measures do not apply.
    assert section["methods"]["Yak"]["abstention_empty"] is None and section["methods"]["Yak"]["abstention_n"] == 0
    assert report["settings"]["relevance_models"]["shipped"].startswith("feature-hashing-384@")
    assert 0.0 < section["distilled_evidence"] <= 1.0
    # The injected block: measured for each Yak method beside the uncut first memories, never larger.
    assert report["settings"]["block"] == {"limit": 5, "odds_gap": 2.0, "token_budget": 600, "profile_tokens": 300,
                                          "gather_limit": 10}
    for name in ("Yak", "Yak (in-sample)", "Yak (shipped model)"):
        chosen, fixed = section["methods"][name]["block"], section["methods"][name]["fixed_block"]
        assert chosen["n"] == fixed["n"] == 5 and set(chosen["by_category"]) == {"1", "2", "3", "4"}
        assert 0.0 <= chosen["block_recall"] <= fixed["block_recall"] <= section["methods"][name]["overall"]["recall@5"]
        assert 0.0 < chosen["block_size"] <= fixed["block_size"] <= 5.0 and 0 < chosen["tokens"] <= fixed["tokens"]
        assert chosen["block_precision"] is None or 0.0 <= chosen["block_precision"] <= 1.0
    assert "BM25" not in section["methods"] or "block" not in section["methods"]["BM25"]
    assert "block" not in section["ablations"]["Yak, no gate"]
    # The file names an ability for two questions: their figures per ability, and only theirs.
    for method in section["methods"].values():
        assert set(method["by_ability"]) == {"information_extraction"} and method["by_ability"]["information_extraction"]["n"] == 2
    assert set(section["methods"]["Yak"]["block"]["by_ability"]) == {"information_extraction"}
    # Two conversations: two folds of one each, within the one file. Neither fold can fit the
    # answerability (the only negatives are questions asked of the held-out person), which is said.
    assert report["cross_validation"]["folds"] == 2 and report["cross_validation"]["within_one_file"]
    assert report["cross_validation"]["assignment"] == {"synthetic": {"conv-a": 1, "conversation-1": 2}}
    assert "2-fold cross-validation" in report["evaluation"] and "within that file" in report["evaluation"]
    assert "could not be fitted" in report["evaluation"]

    from yak_pipeline.eval.report import print_report, write_chart, write_json

    assert json.loads(write_json(report, tmp_path).read_text())["files"]["synthetic"]["methods"]["BM25"]["kind"] == "bm25"
    assert write_chart(report, tmp_path).read_bytes()[:4] == b"\x89PNG"
    assert user_id_for(3, "conv 7/β") == "locomo3-conv-7"
    from rich.console import Console

    console = Console(record=True, width=200)
    print_report(report, console)
    printed = console.export_text()
    assert "synthetic: overall" in printed and "Yak (shipped model)" in printed and "target" in printed
    assert "the injected block" in printed and "first, uncut" in printed and "synthetic: per ability" in printed
    assert "profile hit" in printed and "+profile" in printed


def test_an_exchange_stored_with_a_secret_redacted_still_holds_its_turns(settings: Settings, database) -> None:  # noqa: ANN001
    """The eval finds each stored exchange by its text as stored: with a secret replaced
    (core.secrets), the hash of the text as given matched nothing and the turn counted for no method."""
    from yak_pipeline.embeddings import get_embedder
    from yak_pipeline.eval.ingest import _ingest

    data = synthetic_locomo()[1:]
    data[0]["conversation"]["session_1"].append(
        _turn("Cy", "D1:3", "My OpenAI key is sk-proj-Xq3vT9mB2nL7kR4wZ8yC1dF6hJ0pA5sE, keep it safe."))
    ingested, _ = _ingest(database, settings, get_embedder(settings), parse_locomo(data), lambda line: None,
                          distiller="none")
    held = set().union(*ingested[0].memory_turns.values())
    assert held == {"D1:1", "D1:2", "D1:3"}
    with database.connection() as conn:
        stored = conn.execute("SELECT content FROM memories WHERE content LIKE %s", ("%OpenAI key%",)).fetchone()[0]
    assert "sk-proj-" not in stored


def test_the_profile_hit_measures_whether_a_standing_instruction_reaches_the_block(settings: Settings) -> None:
    """Issue 39: an instruction the question never mentions is in the block through the profile."""
    data = synthetic_locomo()
    data[1]["conversation"]["session_1"].append(
        _turn("Cy", "D1:3", "Always give distances in kilometres when I ask about travel."))
    data[1]["qa"].append({"question": "How far is it from Porto to Faro?", "answer": "about 550 km",
                          "evidence": ["D1:3"], "category": 4, "ability": "instruction_following"})
    report = run_locomo_eval(settings, parse_locomo(data), EvalOptions(ks=(1, 5)), data_label="synthetic")
    chosen = report["files"]["synthetic"]["methods"]["Yak"]["block"]
    assert chosen["by_ability"]["instruction_following"]["profile_hit"] == 1.0
    assert chosen["by_ability"]["information_extraction"]["profile_hit"] is None
    assert chosen["profile_hit_n"] == 1
    # Cy's blocks carry the line (one of the two conversations): the tokens with the profile are more.
    assert chosen["profile_tokens"] > 0 and chosen["tokens_with_profile"] > chosen["tokens"]


def test_the_llm_judge_is_scored_as_its_own_method(settings: Settings, openai_server: FakeOpenAIServer) -> None:
    """``--llm-judge``: "Yak + LLM judge" beside the default, the LLM asked through the real openai client."""
    def judging(request: dict) -> Reply:  # a judge that finds every memory irrelevant but the kitten's
        task, payload = parse_payload(request["messages"][-1]["content"])
        if task != "relevance":
            return rules_replier(request)  # the pipeline's own calls (distil, conflict, merge)
        return Reply.json({"score": 0.9 if "Miso" in payload["memory"] else 0.1})

    openai_server.replier = judging
    judged_settings = settings.model_copy(update={"llm_base_url": openai_server.base_url, "llm_max_retries": 0})
    report = run_locomo_eval(judged_settings, parse_locomo(synthetic_locomo()),
                             EvalOptions(ks=(1, 5), threshold=0.0, llm_judge=True), data_label="synthetic")
    assert report["distiller"] == "llm"  # the configured endpoint distils when none is named
    section = report["files"]["synthetic"]
    assert list(section["methods"]) == ["BM25", "dense", "Yak", "Yak (in-sample)", "Yak (shipped model)",
                                        "Yak, no query parts", "Yak, no update reading",
                                        "Yak + LLM judge"] and section["ablations"] == {}
    judged, default = section["methods"]["Yak + LLM judge"], section["methods"]["Yak"]
    assert judged["kind"] == "yak_judged" and judged["overall"]["n"] == default["overall"]["n"] == 5
    # Only the kitten question keeps its evidence (the judge dropped every other memory).
    assert judged["by_category"]["4"]["recall@5"] < default["by_category"]["4"]["recall@5"]
    assert judged["overall"]["hit@5"] == pytest.approx(1 / 5)
    asked = [parse_payload(r.body["messages"][-1]["content"]) for r in openai_server.chat_requests]
    assert any(task == "relevance" and payload["turn"] == "User: What is the name of Ana's kitten?"
               for task, payload in asked)


def _yak(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_cli_usage_errors_are_one_line_with_exit_2(tmp_path: Path, settings: Settings) -> None:
    import os

    env = {**os.environ, "YAK_HOME": str(settings.home), "YAK_DATABASE_URL": str(settings.database_url),
           "YAK_EMBEDDER": "hashing"}
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps(synthetic_locomo()))
    for args, needle in [
        (["--data", str(tmp_path / "nope.json")], "no such file"),
        (["--data", str(data), "--k", "1,x"], "--k"),
        (["--data", str(data), "--k", "0"], "between 1 and 100"),
        (["--data", str(data), "--limit-conversations", "0"], "--limit-conversations"),
        (["--data", str(data), "--llm-judge"], "YAK_LLM_BASE_URL"),
        (["--data", str(data), "--distiller", "gpt"], "--distiller"),
        (["--data", str(data), "--folds", "1"], "--folds"),
        (["--data", str(data), "--data", str(data)], "twice"),
        (["--data", str(data), "--local-llm", "--distiller", "none"], "--local-llm"),
    ]:
        result = _yak("eval", "locomo", *args, env=env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().count("\n") == 0 and needle in result.stderr
        assert "Traceback" not in result.stderr


def test_cli_prints_json_and_writes_the_files(tmp_path: Path, settings: Settings) -> None:
    import os

    env = {**os.environ, "YAK_HOME": str(settings.home), "YAK_DATABASE_URL": str(settings.database_url),
           "YAK_EMBEDDER": "hashing"}
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps(synthetic_locomo()))
    out = tmp_path / "results"
    result = _yak("eval", "locomo", "--data", str(data), "--k", "1,5", "--limit-conversations", "1", "--json",
                  "--out", str(out), env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    section = report["files"][str(data)]
    # One conversation: no cross-validation, and no in-sample fit (no negatives for the
    # answerability): "Yak" is the shipped model's, and the report says so.
    assert report["conversations"] == 1 and set(section["methods"]) == {"BM25", "dense", "Yak", "Yak (shipped model)",
                                                                          "Yak, no query parts",
                                                                          "Yak, no update reading"}
    assert report["cross_validation"]["folds"] == 0 and "no cross-validation" in report["evaluation"]
    assert report["notes"] and "could not be fitted" in report["notes"][0]
    assert "recall@5" in section["methods"]["Yak"]["by_category"]["4"]
    assert (out / "retrieval_eval.json").exists() and (out / "retrieval_eval.png").exists()
    assert "distilled" in result.stderr  # progress goes to stderr, JSON alone to stdout
