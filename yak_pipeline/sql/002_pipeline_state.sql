-- Pipeline bookkeeping: which new distillations were checked for conflicts and near-duplicates,
-- and the shared alert de-duplication state (one alert per type per window, across processes).

ALTER TABLE distillations
    ADD COLUMN conflict_checked_at timestamptz,
    ADD COLUMN dedup_checked_at    timestamptz;

CREATE INDEX distillations_unchecked_idx ON distillations (user_id)
    WHERE status = 'active' AND (conflict_checked_at IS NULL OR dedup_checked_at IS NULL);

CREATE TABLE alert_state (
    alert_type   text PRIMARY KEY,
    last_sent_at timestamptz NOT NULL,
    suppressed   integer NOT NULL DEFAULT 0 CHECK (suppressed >= 0)
);

-- The verdict of the distillation quality gate per (user, day) partition. Downstream steps
-- (conflict scoring, merges) read it, so a failed gate holds them back across runs, not only
-- within the run where the check failed.
CREATE TABLE partition_gates (
    user_id    text NOT NULL,
    day        date NOT NULL,
    passed     boolean NOT NULL,
    failures   jsonb NOT NULL DEFAULT '[]',
    checked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, day)
);
