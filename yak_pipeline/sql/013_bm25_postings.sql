-- BM25 from postings kept by triggers, so a query opens no exchange's row
-- (issue "Fast on the default path", part 2; store/recall.py).
--
-- BM25 needs, for each query word, every row holding it (its term frequency and the row's
-- length) and how many of the user's rows hold it. Computed from the rows, that meant opening
-- every exchange a common word ("like", "work") matches: a third of a heavy user's history,
-- each exchange's context tsvector read back from TOAST (the vectors stay in the row, sql/012,
-- so the tsvectors go out of line): 45,000 buffers and 170-320 ms for one word over 10,000
-- exchanges (bench/recall_latency.py --corpus realistic, docs/BENCHMARKS.md). Here each
-- (user, word, row) is one posting with its term frequency and the row's length, read from the
-- primary key's index alone (an index-only scan); a word's document frequency is the count of
-- its postings, and the corpus size and mean length come from the index-only scan the rows'
-- computation already used. Statement-level triggers write the postings in the writer's own
-- transaction, so every write path (the pipeline, the API, imports, restores, forgetting,
-- review decisions, merges, re-embedding) keeps them exact; the result equals the computation
-- from the rows (tested; that computation stays as the reference).
--
-- Legs (the two of recall's default path; `as_of` and `exchange_context` off use the rows):
--   'distillations': active, live distillations, per embedding model (scope), over content_tsv;
--   'contexts':      live exchanges, over context_tsv (each exchange with its neighbours, sql/006).

-- For the searches that still read rows (`as_of`, `exchange_context` off, the evaluation's BM25
-- baseline), a word's rows *of one user* are found inside the index: with user_id in the
-- full-text indexes (btree_gin, a contrib extension PostgreSQL marks trusted), a word common in
-- every user's history no longer sends the scan to the rows of all users to keep one user's.
-- A server without contrib (btree_gin not installed) keeps the single-column indexes.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gin') THEN
        CREATE EXTENSION IF NOT EXISTS btree_gin;
        DROP INDEX distillations_tsv_idx;
        CREATE INDEX distillations_tsv_idx ON distillations USING gin (user_id, content_tsv);
        DROP INDEX memories_tsv_idx;
        CREATE INDEX memories_tsv_idx ON memories USING gin (user_id, content_tsv);
        DROP INDEX memories_context_tsv_idx;
        CREATE INDEX memories_context_tsv_idx ON memories USING gin (user_id, context_tsv);
    END IF;
END
$$;

CREATE TABLE bm25_postings (
    leg     text    NOT NULL,
    user_id text    NOT NULL,
    scope   text    NOT NULL,
    lexeme  text    NOT NULL,
    row_id  uuid    NOT NULL,
    tf      integer NOT NULL,
    dl      integer,
    PRIMARY KEY (leg, user_id, scope, lexeme, row_id) INCLUDE (tf, dl)
);

-- Adds (sign +1) or removes (-1) rows' postings. Nothing here updates a row in place: a
-- counter (a word's document frequency, a corpus's size) updated by every write of a user would
-- be one row rewritten tens of thousands of times by a long import in one transaction, each
-- version chained to the last. Document frequencies and corpus sizes are counted when a query
-- runs (store/recall.py), from these postings and from an index-only scan of the rows.
CREATE FUNCTION yak_bm25_apply(p_leg text, p_ids uuid[], p_users text[], p_scopes text[], p_signs int[],
                               p_tsvs tsvector[], p_terms int[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_users), 0) = 0 THEN
        RETURN;
    END IF;
    -- Postings: a removed row's go, an added row's come (an update is both, in that order).
    DELETE FROM bm25_postings p
     USING unnest(p_ids, p_users, p_scopes, p_signs, p_tsvs) AS d(id, u, s, sign, tsv)
     CROSS JOIN LATERAL unnest(tsvector_to_array(d.tsv)) AS w(lexeme)
     WHERE d.sign < 0 AND p.leg = p_leg AND p.user_id = d.u AND p.scope = d.s AND p.lexeme = w.lexeme
       AND p.row_id = d.id;
    INSERT INTO bm25_postings (leg, user_id, scope, lexeme, row_id, tf, dl)
    SELECT p_leg, d.u, d.s, w.lexeme, d.id, greatest(cardinality(w.positions), 1), d.terms
      FROM unnest(p_ids, p_users, p_scopes, p_signs, p_tsvs, p_terms) AS d(id, u, s, sign, tsv, terms)
     CROSS JOIN LATERAL unnest(d.tsv) AS w
     WHERE d.sign > 0
     ORDER BY 2, 3, 4, 5;
END
$$;

-- Distillations: a row counts while active and live, under its embedding model.
CREATE FUNCTION yak_bm25_distillations_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM yak_bm25_apply('distillations', array_agg(n.id), array_agg(n.user_id), array_agg(coalesce(n.embedding_model, '')),
                               array_agg(1), array_agg(n.content_tsv), array_agg(n.content_terms))
           FROM new_rows n WHERE n.status = 'active' AND n.deleted_at IS NULL;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM yak_bm25_apply('distillations', array_agg(o.id), array_agg(o.user_id), array_agg(coalesce(o.embedding_model, '')),
                               array_agg(-1), array_agg(o.content_tsv), array_agg(o.content_terms))
           FROM old_rows o WHERE o.status = 'active' AND o.deleted_at IS NULL;
    ELSE
        -- Only rows whose standing or words changed (warmth updates change neither): the old row's
        -- contribution goes (sign -1) and the new one's comes (+1), each where that row counts.
        PERFORM yak_bm25_apply('distillations', array_agg(d.id), array_agg(d.user_id), array_agg(d.scope), array_agg(d.sign),
                               array_agg(d.tsv), array_agg(d.terms))
           FROM old_rows o JOIN new_rows n ON n.id = o.id
          CROSS JOIN LATERAL (VALUES
                    (o.id, o.user_id, coalesce(o.embedding_model, ''), -1, o.content_tsv, o.content_terms,
                     o.status = 'active' AND o.deleted_at IS NULL),
                    (n.id, n.user_id, coalesce(n.embedding_model, ''), 1, n.content_tsv, n.content_terms,
                     n.status = 'active' AND n.deleted_at IS NULL)
                ) AS d(id, user_id, scope, sign, tsv, terms, counts)
          WHERE (o.user_id, o.status, o.deleted_at IS NULL, o.embedding_model, o.content_tsv)
                IS DISTINCT FROM (n.user_id, n.status, n.deleted_at IS NULL, n.embedding_model, n.content_tsv)
            AND d.counts;
    END IF;
    RETURN NULL;
END
$$;

-- Exchanges: a row counts while live; its words are its context.
CREATE FUNCTION yak_bm25_contexts_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM yak_bm25_apply('contexts', array_agg(n.id), array_agg(n.user_id), array_agg(''::text), array_agg(1),
                               array_agg(n.context_tsv), array_agg(n.context_terms))
           FROM new_rows n WHERE n.deleted_at IS NULL;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM yak_bm25_apply('contexts', array_agg(o.id), array_agg(o.user_id), array_agg(''::text), array_agg(-1),
                               array_agg(o.context_tsv), array_agg(o.context_terms))
           FROM old_rows o WHERE o.deleted_at IS NULL;
    ELSE
        -- As for distillations: the old row's contribution goes, the new one's comes.
        PERFORM yak_bm25_apply('contexts', array_agg(d.id), array_agg(d.user_id), array_agg(''::text), array_agg(d.sign),
                               array_agg(d.tsv), array_agg(d.terms))
           FROM old_rows o JOIN new_rows n ON n.id = o.id
          CROSS JOIN LATERAL (VALUES
                    (o.id, o.user_id, -1, o.context_tsv, o.context_terms, o.deleted_at IS NULL),
                    (n.id, n.user_id, 1, n.context_tsv, n.context_terms, n.deleted_at IS NULL)
                ) AS d(id, user_id, sign, tsv, terms, counts)
          WHERE (o.user_id, o.deleted_at IS NULL, o.context_tsv)
                IS DISTINCT FROM (n.user_id, n.deleted_at IS NULL, n.context_tsv)
            AND d.counts;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER distillations_bm25_insert AFTER INSERT ON distillations
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION yak_bm25_distillations_trigger();
CREATE TRIGGER distillations_bm25_update AFTER UPDATE ON distillations
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION yak_bm25_distillations_trigger();
CREATE TRIGGER distillations_bm25_delete AFTER DELETE ON distillations
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION yak_bm25_distillations_trigger();
CREATE TRIGGER memories_bm25_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION yak_bm25_contexts_trigger();
CREATE TRIGGER memories_bm25_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION yak_bm25_contexts_trigger();
CREATE TRIGGER memories_bm25_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION yak_bm25_contexts_trigger();

-- Every posting recomputed from the rows: the migration fills the table with it, and it is the
-- reference the tests compare the triggers' work with.
CREATE FUNCTION yak_bm25_rebuild() RETURNS void LANGUAGE sql AS $$
    DELETE FROM bm25_postings;
    INSERT INTO bm25_postings (leg, user_id, scope, lexeme, row_id, tf, dl)
    SELECT 'distillations', d.user_id, coalesce(d.embedding_model, ''), w.lexeme, d.id,
           greatest(cardinality(w.positions), 1), d.content_terms
      FROM distillations d CROSS JOIN LATERAL unnest(d.content_tsv) AS w
     WHERE d.status = 'active' AND d.deleted_at IS NULL
    UNION ALL
    SELECT 'contexts', m.user_id, '', w.lexeme, m.id, greatest(cardinality(w.positions), 1), m.context_terms
      FROM memories m CROSS JOIN LATERAL unnest(m.context_tsv) AS w
     WHERE m.deleted_at IS NULL;
$$;

-- TRUNCATE fires no row or statement trigger of INSERT/UPDATE/DELETE: a truncated table has no
-- rows, so its leg (the trigger's argument) has no postings.
CREATE FUNCTION yak_bm25_truncate_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM bm25_postings WHERE leg = TG_ARGV[0];
    RETURN NULL;
END
$$;
CREATE TRIGGER distillations_bm25_truncate AFTER TRUNCATE ON distillations
    FOR EACH STATEMENT EXECUTE FUNCTION yak_bm25_truncate_trigger('distillations');
CREATE TRIGGER memories_bm25_truncate AFTER TRUNCATE ON memories
    FOR EACH STATEMENT EXECUTE FUNCTION yak_bm25_truncate_trigger('contexts');

SELECT yak_bm25_rebuild();
