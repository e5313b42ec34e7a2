"""The collection pass: each data file ingested into its own scratch database, every question asked once.

Every question is asked as of the day after its conversation's last session (``now`` = last
session time + 1 day): the baselines' rankings (BM25 over the raw exchanges, PostgreSQL full text;
dense, exact cosine over the raw exchanges' vectors, same embedder) and the production candidates
(``store.recall.recall_candidates``, both kinds: active distillations and raw exchanges no active
distillation holds) are collected once and kept. The candidates are labelled with the turns they
hold (a distillation the turns of its exchange and of any merged into it, a raw exchange its own),
so every Yak figure afterwards is a pure re-ranking of them (``eval.ranking``) and they become the
relevance model's examples (``eval.examples``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

from yak_pipeline.core.block_choice import line_tokens
from yak_pipeline.core.query_intent import query_parts
from yak_pipeline.core.recall import Candidate, RecallParams
from yak_pipeline.core.relevance import ANSWERABLE_FEATURES, answerable_features
from yak_pipeline.embeddings import Embedder
from yak_pipeline.eval.ingest import IngestedConversation, _ingest
from yak_pipeline.eval.locomo import Conversation, Question
from yak_pipeline.eval.options import Dataset, EvalOptions, Progress, quiet, resolve_distiller
from yak_pipeline.eval.scratch_database import evaluation_database
from yak_pipeline.services.profile import block_profile
from yak_pipeline.settings import Settings
from yak_pipeline.store.bm25 import bm25_search
from yak_pipeline.store.database import Database
from yak_pipeline.store.recall import recall_candidates
from yak_pipeline.store.recallable_distillations import active_distillation_ids, source_memories
from yak_pipeline.store.vector_legs import vector_search
from yak_pipeline.wiring import YakParts, parts_of


@dataclass
class AskedQuestion:
    """One question asked once: the baselines' rankings and Yak's candidates, labelled."""

    conversation: IngestedConversation
    question: Question
    vector: Sequence[float]
    candidates: list[Candidate]
    # The turns each candidate holds, by (kind, id).
    held: dict[tuple[str, str], frozenset[str]]
    candidates_ms: float
    baselines: dict[str, list[frozenset[str]]]
    baselines_ms: dict[str, float]
    # The best cosines of another person's memories for this question (answerability negatives).
    stranger_best: list[float] | None = None
    # The candidates of each thing the question lists (``core.query_intent.query_parts``), if any.
    part_candidates: list[list[Candidate]] = field(default_factory=list)


@dataclass
class CollectedFile:
    """A data file after the collection pass: its database (open), conversations and questions."""

    label: str
    conversations: Sequence[Conversation]
    ingested: list[IngestedConversation]
    asked: list[AskedQuestion]
    pipeline: dict[str, Any]
    db: Database


def _distillation_turns(conn: Any, conversation: IngestedConversation, ids: Sequence[str]) -> list[frozenset[str]]:
    """The turns each distillation holds (its memory's and any merged memory's), cached."""
    missing = [i for i in ids if i not in conversation.distillation_turns]
    if missing:
        for distillation_id, memories in source_memories(conn, distillation_ids=missing).items():
            turns: set[str] = set()
            for memory_id in memories:
                turns |= conversation.memory_turns.get(memory_id, frozenset())
            conversation.distillation_turns[distillation_id] = frozenset(turns)
    return [conversation.distillation_turns.get(i, frozenset()) for i in ids]


class Found(Protocol):
    """What :func:`candidate_turns` reads of a memory: a :class:`Candidate` or a ranked one."""

    @property
    def id(self) -> str:
        """The distillation's id, or the raw exchange's."""

    @property
    def kind(self) -> str:
        """``distilled`` or ``raw``."""


def candidate_turns(conn: Any, conversation: IngestedConversation,
                     candidates: Sequence[Found]) -> dict[tuple[str, str], frozenset[str]]:
    """The turns each candidate holds: a raw exchange its own, a distillation :func:`_distillation_turns`."""
    held: dict[tuple[str, str], frozenset[str]] = {}
    distilled = [c.id for c in candidates if c.kind != "raw"]
    for candidate_id, turns in zip(distilled, _distillation_turns(conn, conversation, distilled)):
        held[("distilled", candidate_id)] = turns
    for candidate in candidates:
        if candidate.kind == "raw":
            held[("raw", candidate.id)] = conversation.memory_turns.get(candidate.id, frozenset())
    return held


def best_cosines(candidates: Sequence[Candidate]) -> list[float] | None:
    """The query-level features (ANSWERABLE_FEATURES order) of a candidate list; None when empty."""
    if not candidates:
        return None
    features = answerable_features(candidates[0].signals)  # the best_* are the same for all
    return [features[name] for name in ANSWERABLE_FEATURES]


def _ask(conn: Any, conversation: IngestedConversation, stranger: IngestedConversation | None, question: Question,
         vector: Sequence[float], embedder: Embedder, params: RecallParams) -> AskedQuestion:
    """Ask one question once: BM25's and dense's rankings, Yak's candidates and another user's best cosines."""
    depth = params.limit
    baselines: dict[str, list[frozenset[str]]] = {}
    baselines_ms: dict[str, float] = {}
    began = time.perf_counter()
    hits = bm25_search(conn, table="memories", user_id=conversation.user_id, query=question.question, limit=depth)
    baselines_ms["BM25"] = (time.perf_counter() - began) * 1000
    baselines["BM25"] = [conversation.memory_turns.get(h.id, frozenset()) for h in hits]
    began = time.perf_counter()
    hits = vector_search(conn, table="memories", user_id=conversation.user_id, query_embedding=vector,
                         embedding_model=embedder.model_name, limit=depth, exact=True)
    baselines_ms["dense"] = (time.perf_counter() - began) * 1000
    baselines["dense"] = [conversation.memory_turns.get(h.id, frozenset()) for h in hits]
    began = time.perf_counter()
    candidates = recall_candidates(conn, user_id=conversation.user_id, query=question.question,
                                   query_embedding=vector, embedding_model=embedder.model_name, params=params)
    candidates_ms = (time.perf_counter() - began) * 1000
    part_candidates = [
        recall_candidates(conn, user_id=conversation.user_id, query=part, query_embedding=embedder.embed_query(part),
                          embedding_model=embedder.model_name, params=params, echo=question.question)
        for part in query_parts(question.question)]
    stranger_best = None
    if stranger is not None:
        stranger_best = best_cosines(recall_candidates(
            conn, user_id=stranger.user_id, query=question.question, query_embedding=vector,
            embedding_model=embedder.model_name, params=params))
    every = [*candidates, *(c for part in part_candidates for c in part)]
    return AskedQuestion(conversation=conversation, question=question, vector=vector, candidates=candidates,
                  held=candidate_turns(conn, conversation, every), candidates_ms=candidates_ms,
                  baselines=baselines, baselines_ms=baselines_ms, stranger_best=stranger_best,
                  part_candidates=part_candidates)


def collect(settings: YakParts | Settings, datasets: Sequence[Dataset], options: EvalOptions, *, stack: ExitStack,
            progress: Progress = quiet) -> list[CollectedFile]:
    """The collection pass: each file into its own database (kept open in ``stack``), every question asked
    once, with Yak's parts (or those built from the settings given)."""
    parts = parts_of(settings)
    settings, embedder = parts.settings, parts.embedder
    distiller = resolve_distiller(settings, options.distiller)
    params = parts.recall_params(threshold=options.threshold, limit=max(options.ks))
    files: list[CollectedFile] = []
    for label, conversations in datasets:
        db = stack.enter_context(evaluation_database(settings, keep=options.keep_database, progress=progress))
        ingested, pipeline = _ingest(db, parts, embedder, conversations, progress, distiller=distiller,
                                     label=label)
        asked: list[AskedQuestion] = []
        total = sum(len(c.questions) + len(c.never_said) for c in conversations)
        started = time.monotonic()
        for index, conversation in enumerate(ingested):
            # Another person's memories cannot answer this person's questions: asked of them, every
            # question is a never-said one (for the answerability factor only).
            stranger = ingested[(index + 1) % len(ingested)] if len(ingested) > 1 else None
            questions = list(conversation.source.questions) + list(conversation.source.never_said)
            profile = block_profile(db, conversation.user_id, token_budget=settings.profile_tokens)
            conversation.profile_turns = [conversation.memory_turns.get(line.memory_id, frozenset()) for line in profile]
            conversation.profile_tokens = sum(line_tokens(line.text) for line in profile)
            with db.connection() as conn:
                ids = active_distillation_ids(conn, user_id=conversation.user_id, embedding_model=embedder.model_name)
                held = _distillation_turns(conn, conversation, ids)
                conversation.distilled_turns = frozenset().union(*held) if held else frozenset()
                for question in questions:
                    vector = embedder.embed_query(question.question)
                    asked.append(_ask(conn, conversation, stranger, question, vector, embedder, params))
                    if len(asked) % 50 == 0 or len(asked) == total:
                        rate = len(asked) / max(time.monotonic() - started, 1e-9)
                        progress(f"{label}: asked {len(asked)}/{total} questions ({rate:.1f} questions/s)")
        files.append(CollectedFile(label=label, conversations=conversations, ingested=ingested, asked=asked,
                                   pipeline=pipeline, db=db))
    return files
