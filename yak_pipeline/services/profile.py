"""The user's profile (issue 39): the standing instructions and preferences every block carries.

``store.profile`` keeps the lines, read from the user's own words as each exchange is stored
(``core.profile``); :func:`block_profile` picks what the block carries within its budget
(``core.profile.choose_profile``), and the API, the CLI and the page show exactly that, beside the
lines a budget left out and the ones the user dropped. Dropping a line takes it out of the profile
and leaves the exchange a memory; forgetting the exchange removes both.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from yak_pipeline.core.profile import ProfileLine, choose_profile
from yak_pipeline.store.database import Database
from yak_pipeline.store.profile import profile_lines, rebuild_profile_lines, set_profile_line_status


@dataclass(frozen=True)
class Profile:
    """A user's profile: what the block carries (``sent``), in its order, and every line with it."""

    sent: list[ProfileLine]
    lines: list[ProfileLine]
    token_budget: int

    def as_dict(self) -> dict[str, object]:
        """The API's and ``--json``'s form: every line, whether the block sends it and why not."""
        sent = {line.id: i for i, line in enumerate(self.sent)}
        return {"token_budget": self.token_budget,
                "sent": [line_dict(line) for line in self.sent],
                "lines": [{**line_dict(line), "sent": line.id in sent,
                           "why_not_sent": None if line.id in sent else
                           ("dropped from the profile" if line.dropped else
                            "off (the profile budget is 0)" if self.token_budget == 0 else
                            "the same words are sent from a newer line, or the budget is full")}
                          for line in self.lines]}


def line_dict(line: ProfileLine) -> dict[str, object]:
    """One profile line as JSON."""
    return {"id": line.id, "memory_id": line.memory_id, "kind": line.kind, "text": line.text,
            "said_at": line.said_at.isoformat(), "dropped": line.dropped}


def block_profile(db: Database, user_id: str, *, token_budget: int, as_of: datetime | None = None) -> list[ProfileLine]:
    """The profile lines the user's block carries (said by ``as_of`` when given)."""
    if token_budget <= 0:
        return []
    with db.connection(autocommit=True) as conn:
        return choose_profile(profile_lines(conn, user_id, as_of=as_of), token_budget)


def show_profile(db: Database, user_id: str, *, token_budget: int) -> Profile:
    """The user's whole profile: what every block carries now, and every line (dropped ones too)."""
    with db.connection(autocommit=True) as conn:
        lines = profile_lines(conn, user_id, include_dropped=True)
    return Profile(sent=choose_profile([line for line in lines if not line.dropped], token_budget),
                   lines=lines, token_budget=token_budget)


def drop_profile_lines(db: Database, user_id: str, line_ids: list[str], *, actor: str, keep: bool = False) -> list[str]:
    """Take lines out of the user's profile (``keep``: put them back); the ids changed. The exchanges
    stay memories; to remove one altogether, forget its memory."""
    with db.connection() as conn:
        return set_profile_line_status(conn, line_ids, user_id=user_id, status="active" if keep else "dropped",
                                       actor=actor)


def rebuild_profile(db: Database, *, user_id: str | None = None) -> int:
    """Read every live exchange (of ``user_id``, or everyone) again for its profile lines; how many hold one."""
    with db.connection() as conn:
        return rebuild_profile_lines(conn, user_id=user_id)
