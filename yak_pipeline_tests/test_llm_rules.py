"""The offline rules provider: deterministic distillation, consolidation, conflict and relevance."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import yak_pipeline.llm as llm
from yak_pipeline.core.sentences import count_sentences
from yak_pipeline.llm import LLMProvider, RulesProvider, get_llm_provider
from yak_pipeline.llm.models import ConsolidationOutput, DistillationOutput
from yak_pipeline.llm.rules import user_part
from yak_pipeline.settings import Settings

RULES = RulesProvider()


def distil(user: str, assistant: str = "Got it.") -> tuple[str, float, str]:
    """(content, confidence, tier) of the rules distillation of one exchange."""
    result = RULES.distill(f"User: {user}\nAssistant: {assistant}")
    return result.content, result.confidence, result.tier


@pytest.mark.parametrize(
    ("user", "content", "tier"),
    [
        ("I live in Berlin", "User lives in Berlin.", "core"),
        ("I'm a nurse.", "User is a nurse.", "core"),
        ("my sister Anna is a doctor in Rome", "User's sister Anna is a doctor in Rome.", "core"),
        ("I love hiking!", "User loves hiking.", "medium"),
        ("I usually go swimming on Sundays.", "User usually goes swimming on Sundays.", "medium"),
        ("I work as a data engineer at Zalando.", "User works as a data engineer at Zalando.", "core"),
        ("I'm from Spain", "User is from Spain.", "core"),
        ("My wife and I have two kids.", "User and their wife have two kids.", "core"),
        ("Last year I moved to Lisbon with my partner.", "User moved to Lisbon with their partner last year.", "core"),
        ("When I was a kid, I lived in Ohio.", "User lived in Ohio when they were a kid.", "core"),
        ("I don't eat meat.", "User does not eat meat.", "medium"),
        ("I no longer eat vegetarian, I started eating fish.",
         "User no longer eats vegetarian, they started eating fish.", "medium"),
        ("Hi, I'm Sam.", "User is Sam.", "core"),
        ("I'm tired today.", "User is tired today.", "low"),
        ("i live in berlin. i love dogs", "User lives in berlin. User loves dogs.", "core"),
        # Issue 16.7: a name with more after it is still who the user is; teaching is an occupation.
        ("Hi, I'm Sam, I teach chemistry.", "User is Sam, they teach chemistry.", "core"),
        ("I am Sam and I teach chemistry.", "User is Sam and they teach chemistry.", "core"),
        # ...a request to remember states a fact...
        ("Remind me that my running club meets Thursdays", "User's running club meets Thursdays.", "low"),
        ("Please remember that I'm vegetarian.", "User is vegetarian.", "medium"),
        # ...and a request tacked onto a statement is an instruction, not a fact about the user.
        ("I love Thai food, so please never suggest satay.", "User loves Thai food.", "medium"),
        ("I moved to Porto and please update my address.", "User moved to Porto.", "core"),
    ],
)
def test_first_person_statements_become_user_sentences(user: str, content: str, tier: str) -> None:
    assert distil(user) == (content, 0.9, tier)


def test_a_question_asking_to_be_reminded_is_still_a_question() -> None:
    content, confidence, _ = distil("Can you remind me what I said about the club?")
    assert content.startswith("User asked:") and confidence == 0.5


def test_hedged_statements_get_lower_confidence() -> None:
    assert distil("I think I'm allergic to cats.") == ("User is allergic to cats.", 0.65, "core")
    assert distil("Maybe I'll learn Spanish.")[1] == 0.65
    assert distil("I probably prefer tea.") == ("User probably prefers tea.", 0.65, "medium")
    # One hedged statement makes the whole distillation hedged: the gate then asks for review.
    assert distil("I live in Berlin. I think I might move to Spain.")[1] == 0.65


def test_no_statement_gives_a_summary_the_gate_sends_to_review() -> None:
    assert distil("What's the capital of France?", "Paris.") == ("User asked: What's the capital of France?", 0.5, "low")
    assert distil("The weather is nice today.") == ("User said: The weather is nice today.", 0.5, "low")
    assert distil("Hello!") == ("User said: Hello.", 0.5, "low")


@pytest.mark.parametrize(
    ("user", "content"),
    [
        # Chat drops the "I": past-tense acts, feelings and plans still say something about the user.
        ("Thanks! Got the tattoo a few years ago, it stands for freedom.",
         "User got the tattoo a few years ago, it stands for freedom."),
        ("Love experimenting with spices. Planning a trip there next month.",
         "User loves experimenting with spices. User is planning a trip there next month."),
        ("Been only to Rome once.", "User has been only to Rome once."),
        ("Just finished a 5k run this morning!", "User just finished a 5k run this morning."),
        # "We" is the user with others; "our" is theirs.
        ("Hey Caroline! We celebrated my daughter's birthday with a concert.",
         "User and others celebrated their daughter's birthday with a concert."),
        ("Our dog loves the beach near us.", "User's dog loves the beach near them."),
        # A greeting and the name of whom they address is not part of the statement.
        ("Hi Maria, since we last chatted, I'm volunteering as a mentor.",
         "User is volunteering as a mentor since they last chatted."),
    ],
)
def test_chat_style_statements_become_user_sentences(user: str, content: str) -> None:
    assert distil(user)[:2] == (content, 0.9)


def test_ambiguous_openings_are_not_read_as_the_users_acts() -> None:
    # "Read" may be an imperative, "Excited" a feeling: no statement, and a short quote goes to review.
    assert distil("Read this book!")[1] == 0.5
    assert distil("Excited to go!")[1] == 0.5
    # The country is not "us".
    assert "US" in distil("I moved to the US in 2019.")[0]


def test_an_informative_quote_is_recallable_but_flagged_for_review() -> None:
    # No first-person statement, but the user reported something: quoted, active with needs_review (0.6–0.8).
    content, confidence, _ = distil("Thanks! It was Matt Patterson's concert, his voice and songs were amazing. "
                                    "What's up with you?")
    assert content == "User said: It was Matt Patterson's concert, his voice and songs were amazing."
    assert confidence == 0.7
    # Chit-chat alone stays below the gate.
    assert distil("Wow, that's great!")[1] == 0.5


def test_only_the_users_words_count() -> None:
    content, _, _ = distil("Can you suggest a book?", "I live in Paris and I love Proust.")
    assert "Paris" not in content
    assert RULES.distill("User: \nAssistant: I live in Paris.").content == "User sent an empty message."
    assert user_part("User: a\nAssistant: b\nUser: c\nAssistant: d") == "a\nc"


def test_text_not_in_exchange_form_is_used_whole() -> None:
    assert RULES.distill("I live in Berlin.").content == "User lives in Berlin."
    assert user_part("just some text") == "just some text"


def test_at_most_four_sentences_and_core_facts_are_kept_first() -> None:
    user = (
        "I love jazz. I hate cilantro. I usually run at 6. I enjoy chess. I collect stamps. "
        "I live in Oslo. My brother is a pilot."
    )
    content, confidence, tier = distil(user)
    assert count_sentences(content) == 4 and confidence == 0.9 and tier == "core"
    assert content == "User loves jazz. User hates cilantro. User lives in Oslo. User's brother is a pilot."


def test_questions_are_not_facts() -> None:
    assert distil("Do I need a visa for Japan?")[1] == 0.5


def test_long_sentences_are_cut_within_limits() -> None:
    content, _, _ = distil("I like " + "very " * 400 + "long walks.")
    assert len(content) <= 1000 and count_sentences(content) == 1 and content.startswith("User likes very")


def test_rules_provider_is_deterministic_and_announces_itself() -> None:
    exchange = "User: I live in Berlin and work at SAP.\nAssistant: Cool."
    first, second = RulesProvider().distill(exchange), RulesProvider().distill(exchange)
    assert (first.content, first.confidence, first.tier) == (second.content, second.confidence, second.tier)
    assert RULES.name == "rules" and isinstance(RULES, LLMProvider)
    assert first.stats.attempts == 1 and first.stats.prompt_tokens is None


def test_empty_exchange_is_refused() -> None:
    with pytest.raises(ValueError, match="empty exchange"):
        RULES.distill("  \n ")


def test_get_llm_provider_without_endpoint_logs_the_stand_in_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm, "_notice_logged", False)  # our own once-per-process flag, reset for the test
    with caplog.at_level(logging.INFO, logger="yak_pipeline.llm"):
        first = get_llm_provider(Settings())
        get_llm_provider(Settings())
    assert isinstance(first, RulesProvider) and first.name == "rules"
    notices = [r for r in caplog.records if "rules provider stands in" in r.getMessage()]
    assert len(notices) == 1 and notices[0].levelno == logging.INFO
    assert "YAK_LLM_BASE_URL is unset" in notices[0].getMessage()


_texts = st.text(min_size=1, max_size=400).filter(lambda t: t.strip())
_wordy = st.lists(
    st.sampled_from(
        ["I", "i", "my", "I'm", "live", "love", "in", "Berlin", ".", "!", "?", ",", "Dr.", "e.g.", "maybe",
         "User:", "\nAssistant:", "\n", "think", "and", "work", "as", "a", "nurse", "x" * 50, "…", "'"]
    ),
    min_size=1,
    max_size=80,
).map(" ".join).filter(lambda t: t.strip())


@settings(max_examples=300, deadline=None)
@given(st.one_of(_texts, _wordy))
def test_any_text_distils_to_valid_output(text: str) -> None:
    result = RULES.distill(text)
    DistillationOutput(content=result.content, confidence=result.confidence, tier=result.tier, type=result.memory_type)  # raises if invalid
    assert result.confidence in (0.9, 0.7, 0.65, 0.5)


@settings(max_examples=100, deadline=None)
@given(_texts, _texts)
def test_any_exchange_distils_to_valid_output(user: str, assistant: str) -> None:
    result = RULES.distill(f"User: {user}\nAssistant: {assistant}")
    DistillationOutput(content=result.content, confidence=result.confidence, tier=result.tier, type=result.memory_type)


def test_consolidate_keeps_newer_adds_older_and_caps_at_four() -> None:
    merged = RULES.consolidate("User likes jazz. User has a cat.", "User lives in Paris. User likes jazz.")
    assert merged.content == "User lives in Paris. User likes jazz. User has a cat."
    capped = RULES.consolidate("User has a cat. User has a dog. User plays chess.", "User likes jazz. User likes tea.")
    assert capped.content == "User likes jazz. User likes tea. User has a cat. User has a dog."


def test_consolidate_lets_the_newer_value_win() -> None:
    merged = RULES.consolidate("User lives in Berlin. User likes jazz.", "User lives in Paris.")
    assert merged.content == "User lives in Paris. User likes jazz."


@settings(max_examples=100, deadline=None)
@given(st.one_of(_texts, _wordy), st.one_of(_texts, _wordy))
def test_any_consolidation_is_valid(older: str, newer: str) -> None:
    ConsolidationOutput(content=RULES.consolidate(older, newer).content)


@pytest.mark.parametrize(
    ("a", "b", "low", "high"),
    [
        ("User lives in Berlin.", "User lives in Paris.", 0.8, 1.0),
        ("User works at SAP.", "User works at Google.", 0.8, 1.0),
        ("User is 34 years old.", "User is 41.", 0.8, 1.0),
        ("User likes cats.", "User doesn't like cats.", 0.8, 1.0),
        ("User lives in Berlin.", "User does not live in Berlin.", 0.8, 1.0),
        ("User is a nurse.", "User is a teacher.", 0.8, 1.0),
        ("I live in Paris.", "User lives in Berlin.", 0.8, 1.0),
        ("User lives in Berlin.", "User's sister lives in Rome.", 0.0, 0.3),
        ("User lives in Berlin.", "User lives in Berlin, Germany.", 0.0, 0.3),
        ("User loves hiking.", "User works at SAP.", 0.0, 0.3),
        ("User is a nurse.", "User is a big fan of jazz.", 0.0, 0.3),
        ("User lives in Berlin.", "User lives in Berlin.", 0.0, 0.0),
    ],
)
def test_conflict_score(a: str, b: str, low: float, high: float) -> None:
    forward, backward = RULES.conflict_score(a, b).score, RULES.conflict_score(b, a).score
    assert forward == backward
    assert low <= forward <= high


def _conflict(a: str, b: str) -> float:
    """The conflict score of a pair, checked to be the same both ways round."""
    forward, backward = RULES.conflict_score(a, b).score, RULES.conflict_score(b, a).score
    assert forward == backward
    return forward


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # Negation in its many forms: the plain claim, negated.
        ("User is vegetarian.", "User is no longer vegetarian."),
        ("User is vegetarian.", "User isn't vegetarian anymore."),
        ("User is vegetarian.", "User stopped being vegetarian."),
        ("User is vegetarian.", "User quit being vegetarian."),
        ("User is vegetarian.", "User gave up being vegetarian."),
        ("User is a vegetarian.", "User used to be vegetarian."),
        ("User lives in Lisbon.", "User moved away from Lisbon."),
        ("User has a dog named Rex.", "User no longer has a dog."),
        # A diet says what is not eaten.
        ("User is vegetarian.", "User started eating fish again, so pescatarian now."),
        ("User is vegetarian.", "User eats meat again."),
        # Replaced values: a move, another car, another job.
        ("User lives in Lisbon.", "User moved to Porto."),
        ("User lives in Lisbon.", "User lives in Porto now."),
        ("User lives in Lisbon.", "User moved from Lisbon to Porto."),
        ("The user lives in Lisbon.", "The user relocated to Porto in 2023."),
        ("User drives a blue Renault Zoe.", "User drives a Tesla now."),
        ("User works as a pediatric nurse.", "User works as a teacher now."),
        ("User works as a pediatric nurse.", "User is a teacher now."),
        # A thing given up ends what held it, named in other words or generally.
        ("User drives a blue Renault Zoe.", "User sold the Renault Zoe."),
        ("User drives a blue Renault Zoe.", "User sold their car."),
        ("User works as a pediatric nurse.", "User quit the nursing job."),
        ("User works as a pediatric nurse.", "User quit their job."),
        ("User works at SAP.", "User left their job at SAP."),
    ],
)
def test_negations_and_replaced_values_conflict(a: str, b: str) -> None:
    assert _conflict(a, b) > 0.7


@pytest.mark.parametrize(
    ("earlier", "later"),
    [
        ("I live in Lisbon.", "I moved to Porto last month."),
        ("I live in Lisbon.", "We moved to Porto."),
        ("I'm vegetarian.", "I'm not vegetarian anymore."),
        ("I'm vegetarian.", "I stopped being vegetarian."),
        ("I'm vegetarian.", "I started eating fish again, so I'm pescatarian now."),
        ("I drive a blue Renault Zoe.", "I sold my Renault Zoe."),
        ("I drive a blue Renault Zoe.", "I drive a Tesla now."),
        ("I work as a pediatric nurse.", "I'm a teacher now."),
        ("I work as a pediatric nurse.", "I quit my nursing job."),
    ],
)
def test_rules_distillations_of_a_change_conflict(earlier: str, later: str) -> None:
    # What this provider's own distil makes of the user's words ("User moved to Porto last month.",
    # "User and others moved to Porto.", "…, so they are pescatarian now.") is read as well.
    assert _conflict(RULES.distill(earlier).content, RULES.distill(later).content) > 0.7


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # Unrelated or compatible.
        ("User lives in Lisbon.", "User likes Lisbon's trams."),
        ("User is vegetarian.", "User likes tomatoes."),
        ("User has a dog named Rex.", "User has a cat named Tom."),  # two pets
        ("User is vegetarian.", "User is allergic to nuts."),
        ("User is vegetarian.", "User is vegan now."),
        ("User is vegetarian.", "User does not eat meat."),
        ("User works as a pediatric nurse.", "User works at a hospital."),
        ("User works as a pediatric nurse.", "User is a mother of two."),
        ("User works as a pediatric nurse.", "User quit the gym."),
        ("User drives a blue Renault Zoe.", "User drives to work every day."),
        ("User is from Lisbon.", "User moved to Porto."),
        # Not a move of the user's home, or not one yet.
        ("User lives in Lisbon.", "User moved to a bigger flat."),
        ("User lives in Lisbon.", "User is moving to Porto next year."),
        ("User lives in Lisbon.", "User's sister moved to Porto."),
        ("User lives in Lisbon.", "User lived in Ohio when they were a kid."),
        # A negation in one clause does not reach the other; a double negation is none.
        ("User lives in Lisbon and does not own a car.", "User lives in Lisbon."),
        ("User likes cats but not dogs.", "User likes cats."),
        ("User didn't quit their job.", "User works as a nurse."),
        ("User hasn't stopped being vegetarian.", "User is vegetarian."),
        # The same statement, and paraphrases of it (near-duplicates, not contradictions).
        ("User lives in Lisbon.", "User lives in Lisbon."),
        ("User lives in Lisbon.", "User lives in Lisbon now."),
        ("User lives in Lisbon.", "User moved to Lisbon last year."),
        ("User is vegetarian.", "User is a vegetarian."),
        ("User drives a blue Renault Zoe.", "User drives a Renault Zoe."),
        ("User works as a pediatric nurse.", "User is a pediatric nurse."),
        ("User works as a pediatric nurse.", "User works as a nurse at a children's hospital."),
    ],
)
def test_compatible_statements_and_paraphrases_do_not_conflict(a: str, b: str) -> None:
    assert _conflict(a, b) <= 0.3


def test_relevance_score() -> None:
    memory = "User lives in Berlin."
    assert RULES.relevance_score(memory, "User: What's the weather like in Berlin?\nAssistant: Sunny.").score >= 0.5
    assert RULES.relevance_score(memory, "User: Tell me a joke about cats.\nAssistant: ...").score == 0.0
    assert RULES.relevance_score("User's sister Anna lives in Rome.", "How is Anna doing in Rome?").score == 1.0
    assert RULES.relevance_score("", "anything").score == 0.0


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200), st.text(max_size=200))
def test_scores_are_always_in_range(a: str, b: str) -> None:
    assert 0.0 <= RULES.conflict_score(a, b).score <= 1.0
    assert 0.0 <= RULES.relevance_score(a, b).score <= 1.0


@pytest.mark.parametrize(("user", "memory_type"), [
    ("Always answer me in French, please.", "instruction"),
    ("I'd rather take trains everywhere.", "preference"),
    ("I finished the migration last Tuesday.", "event"),
    ("My exam is on 3 May.", "event"),
    ("I live in Berlin and work as a nurse.", "fact"),
])
def test_rules_distillations_are_typed_and_their_text_is_unchanged(user: str, memory_type: str) -> None:
    result = RULES.distill(f"User: {user}\nAssistant: Noted.")
    assert result.memory_type == memory_type
    # The type is added beside the text: the text is what it was before types (recall sees the same).
    assert result.content == RULES.distill(f"User: {user}\nAssistant: Something else entirely.").content
