-- The HTTP API's state (issue 4): API keys, forget confirmations, and the metrics behind /metrics.
--
-- Metrics live here, not in one process's memory, so /metrics counts work done by every process:
-- API workers and pipeline runs alike. Writers only ever *append* to metric_events (triggers on
-- the tables that record the work, the API's request counts, the pipeline's latency samples);
-- a scrape folds the appended rows into the totals tables in one transaction. Appending never
-- contends on a hot counter row, so a long transaction (a turn evaluated with several LLM calls)
-- never holds up another; a rolled-back transaction takes its metric rows with it.

-- API keys: only a SHA-256 of each key is stored; the key itself is shown once, at creation.
CREATE TABLE api_keys (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    key_hash   text NOT NULL UNIQUE CHECK (key_hash ~ '^[0-9a-f]{64}$'),
    -- The first characters of the key, so a person can tell keys apart in `yak keys list`.
    prefix     text NOT NULL CHECK (length(prefix) BETWEEN 4 AND 16),
    -- NULL: an admin key. Otherwise the one user whose data the key may touch.
    user_id    text CHECK (user_id IS NULL OR user_id ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    label      text CHECK (label IS NULL OR length(label) <= 200),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX api_keys_admin_idx ON api_keys (created_at) WHERE user_id IS NULL AND revoked_at IS NULL;

-- A forget by phrase lists candidates; deleting them needs this single-use, short-lived token,
-- bound to the user and the exact memory ids shown. Only the token's hash is stored, and never
-- the phrase: a pending forget must not keep the text it is about to forget.
CREATE TABLE forget_confirmations (
    token_hash text PRIMARY KEY CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    user_id    text NOT NULL,
    memory_ids uuid[] NOT NULL CHECK (cardinality(memory_ids) > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CONSTRAINT forget_confirmations_expiry CHECK (expires_at > created_at)
);
CREATE INDEX forget_confirmations_expiry_idx ON forget_confirmations (expires_at);

-- Metric increments and latency samples not yet folded into the totals.
CREATE TABLE metric_events (
    id         bigserial PRIMARY KEY,
    kind       text NOT NULL CHECK (kind IN ('counter', 'observation')),
    name       text NOT NULL CHECK (name ~ '^yak_[a-z0-9_]+$'),
    labels     jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
    -- NaN sorts above Infinity in PostgreSQL, so this also rejects NaN.
    value      double precision NOT NULL CHECK (value >= 0 AND value < 'Infinity'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Counter totals (and each histogram's _sum), monotonic: a forget never lowers them.
CREATE TABLE metric_counters (
    name   text NOT NULL CHECK (name ~ '^yak_[a-z0-9_]+$'),
    labels jsonb NOT NULL DEFAULT '{}',
    value  double precision NOT NULL DEFAULT 0 CHECK (value >= 0),
    PRIMARY KEY (name, labels)
);

-- Histogram observations per bucket, *not* cumulative: `count` samples fell in (previous le, le].
-- le = 'Infinity' holds the samples above the largest bound. The scrape makes them cumulative.
CREATE TABLE metric_histogram_buckets (
    name   text NOT NULL CHECK (name ~ '^yak_[a-z0-9_]+$'),
    labels jsonb NOT NULL DEFAULT '{}',
    le     double precision NOT NULL,
    count  bigint NOT NULL DEFAULT 0 CHECK (count >= 0),
    PRIMARY KEY (name, labels, le)
);

-- Audit rows record the work the metrics count: distillations created and versioned, memories
-- forgotten (one audit row per memory), conflicts detected. The audit log is append-only, so
-- these counts only grow.
CREATE FUNCTION metric_count_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO metric_events (kind, name, labels, value)
    SELECT 'counter', counted.name, counted.labels, count(*)
    FROM (
        SELECT CASE r.action
                   WHEN 'distil' THEN 'yak_distillations_created'
                   WHEN 'version' THEN 'yak_distillations_versioned'
                   WHEN 'forget' THEN 'yak_memories_deleted'
                   WHEN 'conflict' THEN 'yak_conflicts_detected'
               END AS name,
               CASE WHEN r.action = 'version'
                    THEN jsonb_build_object('reason', coalesce(r.detail ->> 'reason', 'unknown'))
                    ELSE '{}'::jsonb
               END AS labels
        FROM new_audit_rows r
        WHERE r.action IN ('distil', 'version', 'forget', 'conflict')
    ) counted
    GROUP BY counted.name, counted.labels;
    RETURN NULL;
END $$;
CREATE TRIGGER audit_log_metrics AFTER INSERT ON audit_log
    REFERENCING NEW TABLE AS new_audit_rows
    FOR EACH STATEMENT EXECUTE FUNCTION metric_count_audit();

-- Every warmth evaluation or reset writes one warmth_events row.
CREATE FUNCTION metric_count_warmth() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO metric_events (kind, name, labels, value)
    SELECT 'counter', 'yak_warmth_updates', jsonb_build_object('reason', r.reason), count(*)
    FROM new_warmth_rows r GROUP BY r.reason;
    RETURN NULL;
END $$;
CREATE TRIGGER warmth_events_metrics AFTER INSERT ON warmth_events
    REFERENCING NEW TABLE AS new_warmth_rows
    FOR EACH STATEMENT EXECUTE FUNCTION metric_count_warmth();

-- A failed attempt on a memory (distillation or its embedding) or on a turn (warmth evaluation)
-- raises `attempts` and sets `last_error`: each such attempt is one error of that type. A row
-- trigger limited to `attempts` never fires for the far more common updates (status, vectors).
CREATE FUNCTION metric_count_failed_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO metric_events (kind, name, labels, value)
    VALUES ('counter', 'yak_errors_total', jsonb_build_object('type', TG_ARGV[0]), 1);
    RETURN NULL;
END $$;
CREATE TRIGGER memories_error_metrics AFTER UPDATE OF attempts ON memories
    FOR EACH ROW WHEN (NEW.attempts > OLD.attempts AND NEW.last_error IS NOT NULL)
    EXECUTE FUNCTION metric_count_failed_attempt('distillation_failed');
CREATE TRIGGER turns_error_metrics AFTER UPDATE OF attempts ON turns
    FOR EACH ROW WHEN (NEW.attempts > OLD.attempts AND NEW.last_error IS NOT NULL)
    EXECUTE FUNCTION metric_count_failed_attempt('warmth_failed');

-- A database that already holds work starts its counters from what the audit log and the
-- warmth events record.
INSERT INTO metric_counters (name, labels, value)
SELECT CASE action
           WHEN 'distil' THEN 'yak_distillations_created'
           WHEN 'version' THEN 'yak_distillations_versioned'
           WHEN 'forget' THEN 'yak_memories_deleted'
           WHEN 'conflict' THEN 'yak_conflicts_detected'
       END,
       CASE WHEN action = 'version' THEN jsonb_build_object('reason', coalesce(detail ->> 'reason', 'unknown'))
            ELSE '{}'::jsonb END,
       count(*)
FROM audit_log WHERE action IN ('distil', 'version', 'forget', 'conflict')
GROUP BY 1, 2;

INSERT INTO metric_counters (name, labels, value)
SELECT 'yak_warmth_updates', jsonb_build_object('reason', reason), count(*)
FROM warmth_events GROUP BY reason;
