-- Forgetting a turn undoes the warmth it caused (issue "The first hour of a new user", 16.8).
--
-- A turn's evaluations warmed or cooled the memories it recalled; forgetting the turn (its
-- exchange) deleted those warmth events with it, and left the memories' warmth changed with no
-- history to say why. Now the forget moves each such memory's warmth back by what the turn's
-- evaluations moved it (within [0, 1]) and records that as an event of its own, reason
-- 'forgotten', so the history stays whole and tells what happened.

ALTER TABLE warmth_events DROP CONSTRAINT warmth_events_reason_check;
ALTER TABLE warmth_events ADD CONSTRAINT warmth_events_reason_check
    CHECK (reason IN ('turn', 'nightly', 'manual', 'reset', 'forgotten'));
