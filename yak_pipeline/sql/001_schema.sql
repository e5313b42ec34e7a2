-- Yak schema, DESIGN §3. Constraints make bad states impossible rather than merely unlikely.
-- {{EMBEDDING_DIM}} is replaced by the migration runner with the configured embedder's size
-- at first migration; it is recorded in yak_meta and checked on every later start.

CREATE EXTENSION IF NOT EXISTS vector;

-- Facts about this database that the code must agree with (embedding size and model).
CREATE TABLE yak_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

-- The raw layer, the source of truth: every exchange at full fidelity.
CREATE TABLE memories (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id        text NOT NULL CHECK (user_id ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    content        text NOT NULL CHECK (length(btrim(content)) > 0),
    occurred_at    timestamptz NOT NULL DEFAULT now(),
    created_at     timestamptz NOT NULL DEFAULT now(),
    source         text NOT NULL CHECK (source IN ('api', 'drop_folder', 'import')),
    source_ref     text,
    content_sha256 text NOT NULL CHECK (content_sha256 ~ '^[0-9a-f]{64}$'),
    status         text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'distilled', 'failed')),
    attempts       integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error     text,
    deleted_at     timestamptz,
    content_tsv    tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    CONSTRAINT memories_user_content_unique UNIQUE (user_id, content_sha256),
    -- Lets distillations reference (id, user_id) so a distillation can never change hands.
    CONSTRAINT memories_id_user_unique UNIQUE (id, user_id)
);
CREATE INDEX memories_user_status_idx ON memories (user_id, status);
CREATE INDEX memories_status_idx ON memories (status) WHERE status <> 'distilled';
CREATE INDEX memories_occurred_idx ON memories (user_id, occurred_at);
CREATE INDEX memories_tsv_idx ON memories USING gin (content_tsv);

CREATE TABLE distillations (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    memory_id       uuid NOT NULL,
    user_id         text NOT NULL,
    content         text NOT NULL CHECK (length(btrim(content)) > 0),
    confidence      double precision NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
    tier            text NOT NULL CHECK (tier IN ('core', 'medium', 'low')),
    warmth          double precision NOT NULL DEFAULT 0.5 CHECK (warmth >= 0 AND warmth <= 1),
    user_weight     double precision NOT NULL DEFAULT 1.0 CHECK (user_weight > 0 AND user_weight <= 10),
    status          text NOT NULL CHECK (status IN ('active', 'review', 'rejected', 'merged')),
    needs_review    boolean NOT NULL DEFAULT false,
    embedding       vector({{EMBEDDING_DIM}}),
    embedding_model text,
    prompt_version  text NOT NULL,
    schema_version  integer NOT NULL DEFAULT 1,
    -- When the fact was last stated or revised: the source exchange's time, then the time of
    -- the latest version. Recall decay is measured from here (DESIGN §4).
    refreshed_at    timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    deleted_at      timestamptz,
    content_tsv     tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    CONSTRAINT distillations_memory_fk FOREIGN KEY (memory_id, user_id)
        REFERENCES memories (id, user_id) ON DELETE CASCADE,
    CONSTRAINT distillations_id_user_unique UNIQUE (id, user_id),
    -- The confidence gate, enforced by the database too: nothing under 0.6 is ever recallable.
    CONSTRAINT distillations_active_gate CHECK (status <> 'active' OR confidence >= 0.6),
    CONSTRAINT distillations_active_embedded CHECK (
        status <> 'active' OR (embedding IS NOT NULL AND embedding_model IS NOT NULL))
);
CREATE INDEX distillations_user_status_idx ON distillations (user_id, status);
CREATE INDEX distillations_memory_idx ON distillations (memory_id);
CREATE INDEX distillations_tier_idx ON distillations (tier);
CREATE INDEX distillations_warmth_idx ON distillations (warmth);
CREATE INDEX distillations_review_idx ON distillations (user_id) WHERE needs_review OR status = 'review';
CREATE INDEX distillations_tsv_idx ON distillations USING gin (content_tsv);
CREATE INDEX distillations_embedding_hnsw ON distillations USING hnsw (embedding vector_cosine_ops);

-- Every content of a distillation, in order; nothing is lost on a merge or a re-distillation.
-- The embedding is kept per version so a version can be restored without re-embedding.
CREATE TABLE distillation_versions (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    distillation_id uuid NOT NULL REFERENCES distillations (id) ON DELETE CASCADE,
    version         integer NOT NULL CHECK (version >= 1),
    content         text NOT NULL CHECK (length(btrim(content)) > 0),
    embedding       vector({{EMBEDDING_DIM}}),
    embedding_model text,
    prompt_version  text,
    reason          text NOT NULL DEFAULT 'distilled'
        CHECK (reason IN ('distilled', 'merged', 'redistilled', 'manual', 'restored')),
    merged_from     uuid[] NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    deleted_at      timestamptz,
    CONSTRAINT distillation_versions_unique UNIQUE (distillation_id, version)
);
CREATE INDEX distillation_versions_merged_from_idx ON distillation_versions USING gin (merged_from);

CREATE TABLE conflicts (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id          text NOT NULL,
    distillation_a   uuid NOT NULL,
    distillation_b   uuid NOT NULL,
    score            double precision NOT NULL CHECK (score >= 0 AND score <= 1),
    status           text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved', 'dismissed')),
    resolution       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at      timestamptz,
    -- Both sides belong to the conflict's user: a conflict can never span users.
    CONSTRAINT conflicts_a_fk FOREIGN KEY (distillation_a, user_id)
        REFERENCES distillations (id, user_id) ON DELETE CASCADE,
    CONSTRAINT conflicts_b_fk FOREIGN KEY (distillation_b, user_id)
        REFERENCES distillations (id, user_id) ON DELETE CASCADE,
    CONSTRAINT conflicts_ordered_pair CHECK (distillation_a < distillation_b),
    CONSTRAINT conflicts_pair_unique UNIQUE (distillation_a, distillation_b)
);
CREATE INDEX conflicts_user_status_idx ON conflicts (user_id, status);
CREATE INDEX conflicts_b_idx ON conflicts (distillation_b);

-- The per-turn evaluation queue.
CREATE TABLE turns (
    id                uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id           text NOT NULL CHECK (user_id ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    -- The exchange this turn stored as a memory; forgetting it removes the turn too.
    memory_id         uuid,
    user_message      text NOT NULL,
    assistant_message text NOT NULL,
    recalled_ids      uuid[] NOT NULL DEFAULT '{}',
    status            text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'evaluated', 'failed')),
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error        text,
    occurred_at       timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    evaluated_at      timestamptz,
    deleted_at        timestamptz,
    CONSTRAINT turns_memory_fk FOREIGN KEY (memory_id, user_id)
        REFERENCES memories (id, user_id) ON DELETE CASCADE
);
CREATE INDEX turns_status_idx ON turns (status, user_id);
CREATE INDEX turns_user_occurred_idx ON turns (user_id, occurred_at);
CREATE INDEX turns_recalled_idx ON turns USING gin (recalled_ids);

CREATE TABLE warmth_events (
    id              bigserial PRIMARY KEY,
    distillation_id uuid NOT NULL REFERENCES distillations (id) ON DELETE CASCADE,
    turn_id         uuid REFERENCES turns (id) ON DELETE CASCADE,
    user_id         text NOT NULL,
    relevance_score double precision CHECK (relevance_score >= 0 AND relevance_score <= 1),
    delta           double precision NOT NULL CHECK (delta >= -1 AND delta <= 1),
    warmth_before   double precision NOT NULL CHECK (warmth_before >= 0 AND warmth_before <= 1),
    warmth_after    double precision NOT NULL CHECK (warmth_after >= 0 AND warmth_after <= 1),
    reason          text NOT NULL CHECK (reason IN ('turn', 'nightly', 'manual', 'reset')),
    evaluator       text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX warmth_events_distillation_idx ON warmth_events (distillation_id, created_at);
CREATE INDEX warmth_events_turn_idx ON warmth_events (turn_id);

-- Append-only record of who did what to which id. It holds ids and counts, never memory text,
-- so it can outlive a forget.
CREATE TABLE audit_log (
    id          bigserial PRIMARY KEY,
    user_id     text,
    actor       text NOT NULL,
    action      text NOT NULL,
    target_type text NOT NULL,
    target_id   text,
    detail      jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_log_user_idx ON audit_log (user_id, created_at);

CREATE FUNCTION audit_log_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_is_append_only();
