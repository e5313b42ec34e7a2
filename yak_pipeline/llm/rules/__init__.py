"""The offline rules provider: a deterministic stand-in for the LLM when no endpoint is configured.

It makes Yak usable (and testable) without a model, and it says so: its ``name`` is ``"rules"``
and :func:`yak_pipeline.llm.get_llm_provider` logs that it stands in. It is not a language model
and its judgements are rough; they are designed to be predictable and to err towards review.

How it works:

- **distill** — takes the user's part of "User: …\\nAssistant: …" (the whole text when it is not in
  that form), splits it into sentences and rewrites first-person statements in the third person:
  "I live in Berlin" → "User lives in Berlin.", "I'm a nurse" → "User is a nurse.", "my sister
  Anna …" → "User's sister Anna …", "We moved …" → "User and others moved …". Chat style is read
  too: a greeting and a name before the statement ("Hi Maria, I'm …"), a dropped "I" before an
  unambiguous past-tense verb or a verb of feeling or intent ("Got the tattoo last year" → "User
  got the tattoo last year", "Planning a trip" → "User is planning a trip"). Questions and
  sentences without such a statement are left out. At most 4 sentences are kept (core facts
  first). Confidence: 0.9 for direct statements, 0.65 when any kept statement is hedged ("I
  think", "maybe", "probably" …). With no statement at all the content quotes the user: their
  informative sentences (not questions, at least 5 content words) as "User said: …" with
  confidence 0.7 — the gate keeps it recallable but flags it for review, since a quote is faithful
  but not distilled — or else the start of their first sentence with confidence 0.5, which the
  gate sends to review. Tier by keywords: identity, location, occupation, family and health →
  core; preferences and habits → medium; the rest → low. Type: the offline classifier of
  :mod:`yak_pipeline.core.memory_types` on the user's words (instruction, preference, event, fact).
- **consolidate** — the newer text's sentences, then the older text's sentences that are not
  already there and not superseded (same subject and predicate, e.g. "User lives in …"), capped at 4.
- **conflict_score** — reads each clause as claims (subject, slot, value, negated) and scores the
  pairs about the same subject: 0.9 when one denies what the other states, 0.85 when a slot that
  holds one value gets two ("lives in" / "moved to", "is from", "was born in", "works as" / "is a
  <job>", "works at", "'s name is", "is N years old", "is married/single …"; 0.8 for "drives a …"
  and short "is a …" values). Denials come in many forms and are read as the plain claim, negated:
  "is not / no longer / isn't … anymore", "stopped / quit / gave up being …", "used to …", "moved
  away from …", and "quit / sold / gave up X" denies any claim whose value is X ("sold the Zoe" /
  "drives a blue Renault Zoe", "quit the nursing job" / "works as a pediatric nurse"). Diets say
  what is (not) eaten, so "is vegetarian" contradicts "is pescatarian" and "started eating fish".
  Things held ("has a dog"), states ("is allergic to …") and food are many at once: only their
  denial contradicts. Paraphrases ("blue Renault Zoe" / "Renault Zoe") are the same value. Else
  0.8 when two clauses share most content words but differ in negation; otherwise at most 0.3
  (scaled by word overlap). Subjects must match, so "User's sister lives in Rome" does not
  contradict "User lives in Berlin".
- **relevance_score** — the overlap coefficient of content words (stop words removed, crude
  stemming): ``|M ∩ C| / min(|M|, |C|)``, 0 when either side has no content words.

Everything here is pure computation on the inputs: no network, no state, hence thread-safe.

The modules, by concern: :mod:`.words` (words, stems, sentences, negations shared by all),
:mod:`.english` (the first- to third-person rewriter), :mod:`.distilling` (confidence, tier, the
quote fallback), :mod:`.claims` (claims for consolidation, the word-overlap contradiction check),
:mod:`.conflicts` (the conflict frames and their scores) and :mod:`.provider` (the provider class).
"""

from yak_pipeline.llm.rules.distilling import DIRECT_CONFIDENCE, HEDGED_CONFIDENCE, QUOTE_CONFIDENCE, SUMMARY_CONFIDENCE
from yak_pipeline.llm.rules.english import user_part
from yak_pipeline.llm.rules.provider import RULES_PROVIDER_NAME, RulesProvider
from yak_pipeline.llm.rules.words import content_words

__all__ = [
    "DIRECT_CONFIDENCE",
    "HEDGED_CONFIDENCE",
    "QUOTE_CONFIDENCE",
    "RULES_PROVIDER_NAME",
    "SUMMARY_CONFIDENCE",
    "RulesProvider",
    "content_words",
    "user_part",
]
