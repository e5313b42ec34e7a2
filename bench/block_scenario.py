"""Issue 33's scenario on the offline defaults: the memory blocks a new user gets.

``python bench/block_scenario.py [rules|none]``: one user tells Yak eight facts, then "I no longer
eat vegetarian, I started eating fish"; each exchange goes through the pipeline's own functions
(``eval.ingest._ingest``: the rules distiller, conflicts, merges, vectors) into a scratch
database, and the block of four questions is printed as the proxy and ``/api/context`` build it
(``services.recall.build_context`` with the configured threshold, odds gap and token budget).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from datetime import UTC, datetime, timedelta

from yak_pipeline.embeddings import get_embedder
from yak_pipeline.eval.ingest import _ingest
from yak_pipeline.eval.locomo import Conversation, Turn
from yak_pipeline.eval.scratch_database import evaluation_database
from yak_pipeline.services.recall import block_choice, build_context, recall_params, relevance_model
from yak_pipeline.settings import get_settings

facts = ["I drink coffee every morning, black.", "I'm vegetarian.", "My sister lives in Lisbon.",
         "I work as a nurse.", "Radiohead is my favourite band.", "I go running three times a week.",
         "I have a peanut allergy.", "I write code in the Helix editor."]
start = datetime(2026, 10, 1, 9, 0, tzinfo=UTC)
turns = []
for i, f in enumerate(facts):
    turns.append(Turn(dia_id=f"D{i+1}:1", speaker="User", text=f, occurred_at=start + timedelta(days=3 * i)))
    turns.append(Turn(dia_id=f"D{i+1}:2", speaker="Assistant", text="Noted.", occurred_at=start + timedelta(days=3 * i)))
late = start + timedelta(days=40)
turns.append(Turn(dia_id="D9:1", speaker="User", text="I no longer eat vegetarian, I started eating fish.", occurred_at=late))
turns.append(Turn(dia_id="D9:2", speaker="Assistant", text="Noted.", occurred_at=late))
conv = Conversation(sample_id="scenario", speakers=("User", "Assistant"), turns=tuple(turns), questions=())
settings = get_settings()
embedder = get_embedder(settings)
mode = sys.argv[1] if len(sys.argv) > 1 else "rules"
with evaluation_database(settings) as db:
    ingested, _ = _ingest(db, settings, embedder, [conv], lambda _: None, distiller=mode, label="scenario")
    user = ingested[0].user_id
    now = late + timedelta(days=1)
    for q in ("what should I cook tonight?", "what do I like to drink?", "which editor do I use?", "what is my dog's name?"):
        block, built = build_context(db, embedder, user_id=user, query=q, params=recall_params(settings), now=now,
                                     model=relevance_model(settings, embedder), choice=block_choice(settings))
        print(f"== {q}\n{block or '(empty block)'}\n")
