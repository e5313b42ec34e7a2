"""What the memory proxy recalls for: the chat's last user message, and a short follow-up read
after the user's message before it.

A chat's last message is often elliptical — "and her birthday?", "why not?", "what about the
second one?" — and names nothing recall could match: the topic is in the user's message before
it. Read together they are a question recall can answer. A message that stands on its own,
though, loses precision when read with an unrelated earlier one (its words weigh less in BM25,
its vector moves towards the other topic, its calibrated relevance falls under the gate). So
the last message is always recalled for alone, and the pair only adds to it (memories the last
message found keep their places; ``services.recall.build_context``), and only when the last
message is short.

Only the user's own messages: the assistant's replies repeat the memories Yak gave it (recall
would feed on itself), and they are long.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from yak_pipeline.core.exchanges import MAX_RECALL_QUERY_CHARS

_WORD = re.compile(r"\w+")


def recall_queries(user_texts: Sequence[str], *, follow_up_words: int) -> list[str]:
    """The texts to recall for, given the user's messages in order (the last one is being answered).

    The last message alone; then, when it has at most ``follow_up_words`` words and an earlier
    user message exists, the previous message and the last one together. Each is cut to its last
    ``MAX_RECALL_QUERY_CHARS`` (a pasted document's question is usually at its end).
    """
    if not user_texts or not user_texts[-1].strip():
        return []
    last = user_texts[-1]
    earlier = [t for t in user_texts[:-1] if t.strip()]
    queries = [last[-MAX_RECALL_QUERY_CHARS:]]
    if earlier and len(_WORD.findall(last)) <= follow_up_words:
        queries.append(f"{earlier[-1]}\n{last}"[-MAX_RECALL_QUERY_CHARS:])
    return queries
