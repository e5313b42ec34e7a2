-- Memory types (issue 39): what kind of thing a distillation says. 'instruction' (how the user
-- wants to be answered), 'preference', 'fact' or 'event' (something that happened, or will, on
-- a day: event_on, resolved against when it was said; only events have one). The distiller labels
-- each new distillation; a person can change it (audited). Existing distillations are typed once,
-- in Python, from their exchange's words by the offline classifier (core.memory_types) when this
-- migration is applied (store.migrations), so an upgraded database is typed too.

ALTER TABLE distillations
    ADD COLUMN memory_type text NOT NULL DEFAULT 'fact'
        CHECK (memory_type IN ('instruction', 'preference', 'fact', 'event')),
    ADD COLUMN event_on date NULL,
    ADD CONSTRAINT distillations_event_on_only_for_events CHECK (event_on IS NULL OR memory_type = 'event');
