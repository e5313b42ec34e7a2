-- Import at database speed (issue 37, item 2): an INSERT refreshes the conversation context of
-- its new exchanges and their neighbours once per statement, not once per row.
--
-- The row trigger of sql/006 ran yak_refresh_exchange_context for each inserted row: three rows
-- rewritten per exchange (itself and its two neighbours), each rewrite an UPDATE statement that
-- fired BM25's statement triggers (sql/013, 014) for one row. A 500-exchange batch of an export
-- took 7.7 s with it and 2.1 s without. Here an INSERT statement of any size runs one UPDATE
-- over the set "the new rows and their neighbours", in the same final state the row trigger
-- read (row triggers fire at the end of the statement too, when every new row is in), each
-- context computed from the same neighbours and text as yak_refresh_exchange_context, by a
-- window (as yak_rebuild_exchange_context) instead of index probes per row: 0.26 s per
-- 500-exchange batch on a loaded 2-core machine (load average 8), where the same set refreshed
-- by yak_refresh_exchange_context's probes took 2.5-3.5 s.
-- The contexts equal the row path's (tested against yak_refresh_exchange_context). A long
-- import then fires BM25's triggers once per batch as well, its postings written in one go.
--
-- UPDATE and DELETE keep the row trigger: a statement trigger cannot name columns and have
-- transition tables at once, and without the column list every status or vector update (the
-- pipeline's most common write) would capture its rows for nothing. The trigger keeps its name,
-- memories_context, now for UPDATE OF content, occurred_at, deleted_at and DELETE.

DROP TRIGGER memories_context ON memories;
CREATE TRIGGER memories_context AFTER DELETE OR UPDATE OF content, occurred_at, deleted_at ON memories
    FOR EACH ROW EXECUTE FUNCTION memories_context_trigger();

CREATE FUNCTION memories_context_insert_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- One writer per user at a time (sql/006); users in a fixed order, so two multi-user
    -- statements cannot each hold the lock the other waits for.
    PERFORM pg_advisory_xact_lock(hashtext('yak_exchange_context'), hashtext(u.user_id))
       FROM (SELECT DISTINCT user_id FROM new_rows ORDER BY user_id) u;
    -- What yak_refresh_exchange_context (the row trigger's refresh) computes for the new rows and
    -- their neighbours, by one window instead of two index probes per row and per neighbour. The
    -- window reads the live rows within two gaps of a new row: a new row's neighbours are within
    -- one gap of it, and theirs within one gap of them, so every row next to an updated row (and
    -- every row between them) is in it. A new row inserted already forgotten is nobody's neighbour.
    -- Each new row's stretch of the timeline read from its index (memories_timeline_idx): as a
    -- plain join (OFFSET 0 keeps it a LATERAL subquery) the planner, its statistics older than an
    -- import's rows, hashed every row of the user and compared each with each new row.
    WITH near_ids AS (
        SELECT DISTINCT m.id
          FROM (SELECT DISTINCT user_id, occurred_at FROM new_rows WHERE deleted_at IS NULL) n
         CROSS JOIN LATERAL (
               SELECT id FROM memories m
                WHERE m.user_id = n.user_id AND m.deleted_at IS NULL
                  AND m.occurred_at BETWEEN n.occurred_at - 2 * yak_context_gap()
                                        AND n.occurred_at + 2 * yak_context_gap()
               OFFSET 0) m
    ), w AS (
        SELECT m.id, m.content,
               CASE WHEN lag(m.occurred_at) OVER t >= m.occurred_at - yak_context_gap() THEN lag(m.id) OVER t END
                   AS prev_id,
               CASE WHEN lag(m.occurred_at) OVER t >= m.occurred_at - yak_context_gap() THEN lag(m.content) OVER t END
                   AS prev_content,
               CASE WHEN lead(m.occurred_at) OVER t <= m.occurred_at + yak_context_gap() THEN lead(m.id) OVER t END
                   AS next_id,
               CASE WHEN lead(m.occurred_at) OVER t <= m.occurred_at + yak_context_gap() THEN lead(m.content) OVER t END
                   AS next_content
          FROM near_ids JOIN memories m ON m.id = near_ids.id
        WINDOW t AS (PARTITION BY m.user_id ORDER BY m.occurred_at, m.seq)
    ), fresh AS (
        SELECT w.id, to_tsvector('english', concat_ws(E'\n', w.prev_content, w.content, w.next_content)) AS tsv
          FROM w
         WHERE w.id IN (SELECT id FROM new_rows) OR w.prev_id IN (SELECT id FROM new_rows)
            OR w.next_id IN (SELECT id FROM new_rows)
    )
    UPDATE memories m
       SET context_tsv = f.tsv,
           context_embedding = CASE WHEN m.context_tsv IS NOT DISTINCT FROM f.tsv THEN m.context_embedding END,
           context_embedding_model = CASE WHEN m.context_tsv IS NOT DISTINCT FROM f.tsv
                                          THEN m.context_embedding_model END
      FROM fresh f WHERE f.id = m.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER memories_context_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION memories_context_insert_trigger();

-- sql/013's postings writer, its DELETE reshaped: the planner, estimating a handful of rows, read
-- each removed row's postings by (leg, user, scope, row) with the word left out of the key, so
-- every probe walked all of the user's postings (4 ms a row at 5,000 exchanges, growing with the
-- history: 2.1 s of a 500-exchange batch). The removed postings are now listed first (a
-- materialized set, one row per word) and each deleted by its whole primary key. Same postings.
CREATE OR REPLACE FUNCTION yak_bm25_apply_postings(p_leg text, p_ids uuid[], p_users text[], p_scopes text[],
                                                   p_signs int[], p_tsvs tsvector[], p_terms int[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_users), 0) = 0 THEN
        RETURN;
    END IF;
    -- Postings: a removed row's go, an added row's come (an update is both, in that order).
    WITH gone AS MATERIALIZED (
        SELECT d.id, d.u, d.s, w.lexeme
          FROM unnest(p_ids, p_users, p_scopes, p_signs, p_tsvs) AS d(id, u, s, sign, tsv)
         CROSS JOIN LATERAL unnest(tsvector_to_array(d.tsv)) AS w(lexeme)
         WHERE d.sign < 0)
    DELETE FROM bm25_postings p
     USING gone g
     WHERE p.leg = p_leg AND p.user_id = g.u AND p.scope = g.s AND p.lexeme = g.lexeme AND p.row_id = g.id;
    INSERT INTO bm25_postings (leg, user_id, scope, lexeme, row_id, tf, dl)
    SELECT p_leg, d.u, d.s, w.lexeme, d.id, greatest(cardinality(w.positions), 1), d.terms
      FROM unnest(p_ids, p_users, p_scopes, p_signs, p_tsvs, p_terms) AS d(id, u, s, sign, tsv, terms)
     CROSS JOIN LATERAL unnest(d.tsv) AS w
     WHERE d.sign > 0
     ORDER BY 2, 3, 4, 5;
END
$$;
