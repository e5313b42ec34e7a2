"""What the memory proxy recalls for (core.conversation_query)."""

from yak_pipeline.core.conversation_query import recall_queries
from yak_pipeline.core.exchanges import MAX_RECALL_QUERY_CHARS


def test_a_short_follow_up_is_also_read_after_the_previous_user_message() -> None:
    said = ["My sister Anna is visiting next week.", "And her birthday?"]
    assert recall_queries(said, follow_up_words=8) == [
        "And her birthday?", "My sister Anna is visiting next week.\nAnd her birthday?"]


def test_a_message_that_stands_alone_is_read_alone() -> None:
    long = "Could you suggest a present for my sister, something she would use at work every day?"
    assert recall_queries(["My sister Anna is visiting.", long], follow_up_words=8) == [long]
    assert recall_queries(["And her birthday?"], follow_up_words=8) == ["And her birthday?"]  # nothing before it
    assert recall_queries(["Anna?", "And her birthday?"], follow_up_words=0) == ["And her birthday?"]  # switched off


def test_blank_messages_count_for_nothing_and_a_blank_last_one_asks_nothing() -> None:
    assert recall_queries(["Anna is visiting.", "  ", "why?"], follow_up_words=8) == ["why?", "Anna is visiting.\nwhy?"]
    assert recall_queries(["Anna is visiting.", " "], follow_up_words=8) == []
    assert recall_queries([], follow_up_words=8) == []


def test_each_query_keeps_the_end_of_a_long_text() -> None:
    pasted = "x" * MAX_RECALL_QUERY_CHARS + " So, tell me again where my sister works these days?"
    first, pair = recall_queries([pasted, "why?"], follow_up_words=8)
    assert first == "why?" and len(pair) == MAX_RECALL_QUERY_CHARS and pair.endswith("works these days?\nwhy?")
    (alone,) = recall_queries(["hi", pasted], follow_up_words=8)
    assert alone == pasted[-MAX_RECALL_QUERY_CHARS:]
