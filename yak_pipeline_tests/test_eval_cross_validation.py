"""The evaluation as Yak is used (a user turn and the assistant's reply are one exchange), the
distillers (``--distiller none``), and the conversation-level cross-validation."""

from __future__ import annotations

from contextlib import ExitStack
from datetime import UTC, datetime

import numpy as np
import psycopg
import pytest

from yak_pipeline.core.exchanges import format_exchange
from yak_pipeline.eval import cross_validation, ranking, runner
from yak_pipeline.eval.calibrate import Examples
from yak_pipeline.eval.collection import collect
from yak_pipeline.eval.cross_validation import assign_folds
from yak_pipeline.eval.ingest import conversation_key
from yak_pipeline.eval.locomo import is_assistant, parse_locomo
from yak_pipeline.eval.options import EvalOptions
from yak_pipeline.eval.runner import run_evaluation
from yak_pipeline.settings import Settings
from yak_pipeline_tests.test_eval_locomo import _turn, synthetic_locomo

# Per person: (name, [(session 1 user turn, reply), …], [(session 2 …)], answerable questions, never-said).
PEOPLE = [
    ("Maya",
     [("I work as a paediatric nurse at the Royal infirmary.", "That sounds demanding."),
      ("My cat Pistachio sleeps on my scrubs.", "Cats love warm laundry.")],
     [("I bought a teal kayak for the canal.", "Enjoy paddling!"),
      ("My brother Tomasz lives in Gdansk.", None)],
     [("Where do I work?", "D1:1", 4), ("What colour is my kayak?", "D2:1", 4)],
     "Which university did I attend?"),
    ("Hiroshi",
     [("I teach violin to children on Saturdays.", "What a lovely thing to do."),
      ("My bonsai juniper is twelve years old.", "That takes patience.")],
     [("I switched to a standing desk for my back.", "Your back will thank you."),
      ("We adopted a greyhound called Biscuit.", "Greyhounds are gentle.")],
     [("What instrument do I teach?", "D1:1", 4), ("What is my dog called?", "D2:3", 4)],
     "What is my favourite football team?"),
    ("Lucia",
     [("I am learning Portuguese before moving to Porto.", "Boa sorte!"),
      ("My flatmate bakes sourdough every Sunday.", "The smell must be great.")],
     [("I ran the Valencia marathon in four hours.", "Congratulations!"),
      ("I grow chillies on my balcony.", "Spicy!")],
     [("Which language am I learning?", "D1:1", 4), ("Which marathon did I run?", "D2:1", 4)],
     "What car do I drive?"),
    ("Sam",
     [("I repair vintage typewriters as a hobby.", "A rare skill."),
      ("My grandmother turned ninety in March.", "Happy birthday to her!")],
     [("I joined a climbing gym near the harbour.", "Have fun bouldering."),
      ("My laptop fan is broken again.", "Time for a repair.")],
     [("What do I repair as a hobby?", "D1:1", 4), ("Where is my climbing gym?", "D2:1", 4)],
     "What is my sister's name?"),
]


def assistant_locomo(people: list = PEOPLE, assistant_name: str = "Assistant") -> list[dict]:
    """Conversations of a user with an assistant in LoCoMo format (``speaker_b`` the assistant)."""
    data = []
    for index, (name, first, second, questions, never_said) in enumerate(people):
        conversation: dict = {"speaker_a": name, "speaker_b": assistant_name,
                              "session_1_date_time": "9:00 am on 3 March, 2024",
                              "session_2_date_time": "6:30 pm on 14 May, 2024"}
        for number, session in ((1, first), (2, second)):
            turns, turn = [], 1
            for said, reply in session:
                turns.append(_turn(name, f"D{number}:{turn}", said))
                turn += 1
                if reply is not None:
                    turns.append(_turn(assistant_name, f"D{number}:{turn}", reply))
                    turn += 1
            conversation[f"session_{number}"] = turns
        qa = [{"question": q, "answer": "x", "evidence": [e], "category": c} for q, e, c in questions]
        qa.append({"question": never_said, "answer": "Not mentioned", "evidence": [], "category": 5})
        data.append({"sample_id": f"person-{index}", "conversation": conversation, "qa": qa})
    return data


# --- pairing -----------------------------------------------------------------------------------------


def test_the_assistant_is_the_second_speaker_named_assistant_in_any_case() -> None:
    assert is_assistant("Assistant") and is_assistant(" assistant ") and is_assistant("ASSISTANT")
    assert not is_assistant("Melanie") and not is_assistant("Assistant Manager")


def test_a_user_turn_and_the_reply_that_follows_are_one_exchange() -> None:
    (maya, *_rest) = parse_locomo(assistant_locomo(assistant_name="assistant"))
    assert maya.with_assistant
    exchanges = maya.exchanges()
    # Four user turns, three replies: four exchanges, one per user turn.
    assert len(maya.turns) == 7 and len(exchanges) == 4
    first = exchanges[0]
    assert first.content == format_exchange("I work as a paediatric nurse at the Royal infirmary.",
                                            "That sounds demanding.")
    assert first.dia_ids == ("D1:1", "D1:2")  # the user's turn first: the one evidence names
    assert first.occurred_at == datetime(2024, 3, 3, 9, 0, tzinfo=UTC)
    assert exchanges[2].occurred_at == datetime(2024, 5, 14, 18, 30, tzinfo=UTC)
    # A user turn with no reply still becomes an exchange of its own.
    assert exchanges[3].content == format_exchange("My brother Tomasz lives in Gdansk.", "(no reply)")
    assert exchanges[3].dia_ids == ("D2:3",)


def test_pairing_edge_cases_and_two_people_unchanged() -> None:
    data = assistant_locomo(PEOPLE[:1])
    conversation = data[0]["conversation"]
    # The assistant opens session 2, then replies twice in a row to one user turn.
    conversation["session_2"] = [
        _turn("Assistant", "D2:1", "Welcome back!"),
        _turn("Maya", "D2:2", "I bought a teal kayak."),
        _turn("Assistant", "D2:3", "Nice."),
        _turn("Assistant", "D2:4", "Where will you paddle?"),
    ]
    (maya,) = parse_locomo(data)
    exchanges = maya.exchanges()
    assert [e.dia_ids for e in exchanges] == [("D1:1", "D1:2"), ("D1:3", "D1:4"), ("D2:1",), ("D2:2", "D2:3", "D2:4")]
    assert exchanges[2].content == format_exchange("(no words)", "Welcome back!")
    assert exchanges[3].content == format_exchange("I bought a teal kayak.", "Nice.\n\nWhere will you paddle?")
    # LoCoMo (two people): one exchange per turn, the speaker named, as before.
    two_people = parse_locomo(synthetic_locomo())[0]
    assert not two_people.with_assistant
    assert [e.content for e in two_people.exchanges()] == [t.exchange() for t in two_people.turns]
    assert [e.dia_ids for e in two_people.exchanges()] == [(t.dia_id,) for t in two_people.turns]


def test_paired_exchanges_are_stored_and_map_evidence_and_none_distils_nothing(settings: Settings) -> None:
    """``--distiller none``: one exchange per user turn stored, vectors and context vectors made,
    no distillation, and every candidate a raw exchange holding its turns."""
    conversations = parse_locomo(assistant_locomo())
    with ExitStack() as stack:
        (collected,) = collect(settings, [("people", conversations)], EvalOptions(ks=(5,), distiller="none"),
                               stack=stack)
        with collected.db.connection() as conn:
            assert conn.execute("SELECT count(*) FROM distillations").fetchone()[0] == 0
            memories = conn.execute("SELECT count(*), count(embedding), count(context_embedding) FROM memories "
                                    "WHERE deleted_at IS NULL").fetchone()
            stored = dict(conn.execute("SELECT id::text, content FROM memories").fetchall())
        user_turns = sum(1 for c in conversations for t in c.turns if t.speaker != "Assistant")
        assert memories == (user_turns, user_turns, user_turns) == (16, 16, 16)
        maya = collected.ingested[0]
        (nurse,) = [m for m, turns in maya.memory_turns.items() if "D1:1" in turns]
        assert maya.memory_turns[nurse] == {"D1:1", "D1:2"}
        assert stored[nurse] == format_exchange("I work as a paediatric nurse at the Royal infirmary.",
                                                "That sounds demanding.")
        assert collected.pipeline["distiller"] == "none" and collected.pipeline["counts"]["distilled"] == 0
        assert collected.pipeline["llm"]["distil"]["calls"] == 0
        assert all(c.kind == "raw" for a in collected.asked for c in a.candidates)
        # Raw candidates are labelled with their own turns: "Where do I work?" finds the nurse exchange.
        where = next(a for a in collected.asked if a.question.question == "Where do I work?")
        assert where.held[("raw", nurse)] == {"D1:1", "D1:2"}
        assert any(where.held[(c.kind, c.id)] & where.question.evidence for c in where.candidates)


def test_a_run_with_no_distiller_recalls_raw_exchanges(settings: Settings) -> None:
    report, model = run_evaluation(settings, [("people", parse_locomo(assistant_locomo()))],
                                   EvalOptions(ks=(1, 5), distiller="none"))
    section = report["files"]["people"]
    assert report["distiller"] == "none" and section["pipeline"]["llm_provider"] == "none"
    assert section["pipeline"]["counts"]["distillations_by_status"] == {}
    assert section["distilled_evidence"] == 0.0  # nothing distilled, yet:
    assert section["exchanges"] == 16 and section["turns"] == 31 and section["paired_conversations"] == 4
    for name in ("Yak", "Yak (in-sample)", "Yak (shipped model)"):
        assert section["methods"][name]["overall"]["hit@5"] > 0.5, name
    assert section["methods"]["Yak"]["abstention_n"] == 4
    # The fitted model knows the new feature (a raw candidate's), as the engine needs.
    assert model is not None and "raw_exchange" in model.weights
    assert model.fitted_on["distiller"] == "none"  # type: ignore[index]
    assert report["in_sample_model"] == model.to_dict()


# --- cross-validation -----------------------------------------------------------------------------


def test_fold_assignment_is_deterministic_round_robin_within_each_file() -> None:
    files = [("paraphrase", 6), ("locomo", 5), ("beam", 10)]
    folds = assign_folds(files, 5)
    assert folds == assign_folds(list(files), 5)
    assert [folds[conversation_key("paraphrase", i)] for i in range(6)] == [0, 1, 2, 3, 4, 0]
    assert [folds[conversation_key("locomo", i)] for i in range(5)] == [1, 2, 3, 4, 0]
    assert [folds[conversation_key("beam", i)] for i in range(10)] == [1, 2, 3, 4, 0, 1, 2, 3, 4, 0]
    sizes = np.bincount(list(folds.values()))
    assert sizes.max() - sizes.min() <= 1 and len(sizes) == 5
    # Every fold trains on every file (each file has conversations outside each fold).
    for fold in range(5):
        for label, count in files:
            assert any(folds[conversation_key(label, i)] != fold for i in range(count))
    with pytest.raises(ValueError):
        assign_folds(files, 1)


def test_a_fold_training_set_drops_the_held_out_conversations_and_questions_asked_of_them() -> None:
    examples = Examples(
        features=np.zeros((3, 1)), labels=np.asarray([1.0, 0.0, 0.0]), files=np.asarray(["f", "f", "f"], dtype=object),
        conversations=np.asarray(["f#0", "f#1", "f#2"], dtype=object),
        query_features=np.zeros((3, 1)), query_labels=np.asarray([1.0, 0.0, 0.0]),
        query_files=np.asarray(["f", "f", "f"], dtype=object),
        query_conversations=np.asarray(["f#0", "f#1", "f#2"], dtype=object),
        query_others=np.asarray(["f#0", "f#2", "f#0"], dtype=object))  # rows 2 and 3: asked of a stranger
    kept = examples.without(frozenset({"f#2"}))
    assert kept.conversations.tolist() == ["f#0", "f#1"]
    assert kept.query_conversations.tolist() == ["f#0"]  # f#1's question asked of f#2's memories is out too


def test_each_conversation_is_ranked_only_by_a_model_that_did_not_see_it(settings: Settings,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    trained_on: dict[str, set[str]] = {}  # model version -> the conversations of its training examples
    real_fit, real_rank = runner.fit_model, ranking._rank

    def fit_model(examples: Examples, **kwargs):  # type: ignore[no-untyped-def]
        model = real_fit(examples, **kwargs)
        kept = examples.without(kwargs.get("exclude", frozenset()))
        trained_on[model.version] = set(kept.conversations.tolist()) | set(kept.query_conversations.tolist()) \
            | set(kept.query_others.tolist())
        return model

    ranked_by: list[tuple[str, str]] = []

    def rank(asked, model, params):  # type: ignore[no-untyped-def]
        ranked_by.append((asked.conversation.key, model.version))
        return real_rank(asked, model, params)

    # The in-sample fit is the runner's, the fold fits cross_validation's.
    monkeypatch.setattr(runner, "fit_model", fit_model)
    monkeypatch.setattr(cross_validation, "fit_model", fit_model)
    monkeypatch.setattr(ranking, "_rank", rank)
    data = assistant_locomo()
    datasets = [("one", parse_locomo(data[:2])), ("two", parse_locomo(data[2:]))]
    report, in_sample = run_evaluation(settings, datasets, EvalOptions(ks=(1, 5), folds=5))
    keys = {conversation_key(label, i) for label in ("one", "two") for i in range(2)}
    # Four conversations: four folds of one, over both files together, every fold fitted.
    assert report["cross_validation"]["folds"] == 4 and not report["cross_validation"]["within_one_file"]
    assert report["cross_validation"]["assignment"] == {"one": {"person-0": 1, "person-1": 2},
                                                        "two": {"person-2": 3, "person-3": 4}}
    assert all(f["failed"] is None for f in report["cross_validation"]["fold_models"].values())
    assert report["evaluation"].startswith("conversation-level 4-fold cross-validation over the 4 conversations")
    fold_versions = {v for v in trained_on if "@fold-" in v}
    assert len(fold_versions) == 4
    for version in fold_versions:  # each fold model saw exactly three conversations
        assert len(trained_on[version]) == 3 and trained_on[version] < keys
    assert in_sample is not None and trained_on[in_sample.version] == keys
    cross_validated = [(key, version) for key, version in ranked_by if version in fold_versions]
    # 3 questions per conversation (2 answerable, 1 never-said), each ranked once per cross-validated
    # Yak method (the default, "Yak, no query parts" and "Yak, no update reading").
    assert {key for key, _ in cross_validated} == keys and len(cross_validated) == 36
    for key, version in cross_validated:
        assert key not in trained_on[version], (key, version)
    assert {version for key, version in ranked_by if version == in_sample.version}
    section = report["files"]["two"]
    assert set(section["methods"]) == {"BM25", "dense", "Yak", "Yak (in-sample)", "Yak (shipped model)",
                                       "Yak, no query parts", "Yak, no update reading"}
    assert section["methods"]["Yak"]["overall"]["n"] == 4 and section["methods"]["Yak"]["abstention_n"] == 2


def test_the_user_database_is_untouched(settings: Settings, db_url: str) -> None:
    run_evaluation(settings, [("people", parse_locomo(assistant_locomo()[:2]))], EvalOptions(ks=(5,), distiller="none"))
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 0


def test_calibrate_fits_on_everything_writes_the_model_and_prints_the_cross_validated_figures(
        tmp_path, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    import json
    import os

    from yak_pipeline.core.relevance import RelevanceModel
    from yak_pipeline_tests.test_eval_locomo import _yak

    env = {**os.environ, "YAK_HOME": str(settings.home), "YAK_DATABASE_URL": str(settings.database_url),
           "YAK_EMBEDDER": "hashing"}
    data = tmp_path / "people.json"
    data.write_text(json.dumps(assistant_locomo()))
    model_path, report_dir = tmp_path / "model.json", tmp_path / "report"
    result = _yak("eval", "calibrate", "--data", str(data), "--distiller", "none", "--folds", "2",
                  "--out", str(model_path), "--report-out", str(report_dir), env=env)
    assert result.returncode == 0, result.stderr
    model = RelevanceModel.from_dict(json.loads(model_path.read_text()))
    assert "raw_exchange" in model.weights and model.fitted_on["distiller"] == "none"  # type: ignore[index]
    assert model.fitted_on["files"]["people.json"]["conversations"] == 4  # type: ignore[index]
    assert "2-fold cross-validation" in result.stdout and "people.json: overall" in result.stdout
    report = json.loads((report_dir / "retrieval_eval.json").read_text())
    assert report["settings"]["relevance_models"]["in_sample"] == model.version
    assert report["cross_validation"]["assignment"] == {str(data): {"person-0": 1, "person-1": 2, "person-2": 1,
                                                                    "person-3": 2}}


def test_re_ranking_the_collected_candidates_is_the_production_recall(settings: Settings) -> None:
    """Yak's figures re-rank the candidates collected once; that must be what ``store.recall.recall`` returns."""
    from yak_pipeline.embeddings import get_embedder
    from yak_pipeline.services.recall import recall_params, relevance_model
    from yak_pipeline.store.recall import recall

    embedder = get_embedder(settings)
    model = relevance_model(settings, embedder)
    params = recall_params(settings, threshold=0.0, limit=5)
    with ExitStack() as stack:
        (collected,) = collect(settings, [("people", parse_locomo(assistant_locomo()[:2]))],
                               EvalOptions(ks=(5,), threshold=0.0), stack=stack)
        compared = 0
        with collected.db.connection() as conn:
            for asked in collected.asked:
                mine = ranking._rank(asked, model, params)
                theirs = recall(conn, user_id=asked.conversation.user_id, query=asked.question.question,
                                query_embedding=asked.vector, embedding_model=embedder.model_name, params=params,
                                model=model, now=asked.conversation.now)
                assert [(r.kind, r.id, r.score) for r in mine] == [(r.kind, r.id, r.score) for r in theirs]
                compared += bool(mine)
        assert compared == len(collected.asked) == 6
        # Both kinds are there with the rules distiller: distillations, and exchanges none holds.
        kinds = {c.kind for a in collected.asked for c in a.candidates}
        assert "distilled" in kinds
