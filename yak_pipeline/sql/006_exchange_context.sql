-- Exchange context for hybrid recall (issue 5, part 2).
--
-- One exchange often makes sense only next to the one before or after it: "Yes, it was so
-- powerful!" answers "How was the support group?". Hybrid recall's exchange-text leg therefore
-- searches each exchange together with its neighbours: the same user's previous and next live
-- exchange, in the order they happened, when they are no more than 30 minutes apart (the same
-- conversation). Measured on LoCoMo: docs/BENCHMARKS.md.
--
-- The context is kept by a trigger, in the writer's own transaction, so every write path
-- (the API, the drop folder, imports, forgetting) keeps it right: an insert refreshes the new
-- exchange and its two neighbours; forgetting one (deleted_at set, or the row deleted)
-- refreshes its neighbours, so a forgotten exchange's words stop matching at once. Writers of
-- the same user take turns (a per-user advisory lock held to commit): otherwise two concurrent
-- transactions would not see each other's new rows, and could deadlock updating each other's
-- neighbours. `yak db index --rebuild-context` recomputes every context (a repair).
--
-- `seq` orders exchanges that share a timestamp (an imported session often does) by arrival.
-- Adding these columns rewrites the memories table once: minutes on a large database.

ALTER TABLE memories
    ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY,
    ADD COLUMN context_tsv tsvector;
ALTER TABLE memories
    ADD COLUMN context_terms integer GENERATED ALWAYS AS (length(context_tsv)) STORED;

CREATE INDEX memories_timeline_idx ON memories (user_id, occurred_at, seq) WHERE deleted_at IS NULL;
CREATE INDEX memories_context_tsv_idx ON memories USING gin (context_tsv);
-- BM25's corpus statistics over contexts, by an index-only scan (as memories_recall_corpus_idx).
CREATE INDEX memories_context_corpus_idx ON memories (user_id) INCLUDE (context_terms) WHERE deleted_at IS NULL;

-- How far apart two exchanges may be and still be one conversation.
CREATE FUNCTION yak_context_gap() RETURNS interval LANGUAGE sql IMMUTABLE AS $$ SELECT interval '30 minutes' $$;

-- The live exchange just before (before = true) or just after a point of a user's timeline,
-- within the gap; NULL when there is none.
CREATE FUNCTION yak_exchange_neighbour(p_user text, p_at timestamptz, p_seq bigint, before boolean)
RETURNS uuid LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN before THEN
        (SELECT id FROM memories
          WHERE user_id = p_user AND deleted_at IS NULL AND (occurred_at, seq) < (p_at, p_seq)
            AND occurred_at >= p_at - yak_context_gap()
          ORDER BY occurred_at DESC, seq DESC LIMIT 1)
    ELSE
        (SELECT id FROM memories
          WHERE user_id = p_user AND deleted_at IS NULL AND (occurred_at, seq) > (p_at, p_seq)
            AND occurred_at <= p_at + yak_context_gap()
          ORDER BY occurred_at, seq LIMIT 1)
    END
$$;

-- Recomputes the context of the given live exchanges: previous, own and next exchange's text.
CREATE FUNCTION yak_refresh_exchange_context(ids uuid[]) RETURNS void LANGUAGE sql AS $$
    UPDATE memories m
       SET context_tsv = to_tsvector('english', concat_ws(E'\n',
               (SELECT content FROM memories p
                 WHERE p.id = yak_exchange_neighbour(m.user_id, m.occurred_at, m.seq, true)),
               m.content,
               (SELECT content FROM memories n
                 WHERE n.id = yak_exchange_neighbour(m.user_id, m.occurred_at, m.seq, false))))
     WHERE m.id = ANY(ids) AND m.deleted_at IS NULL
$$;

CREATE FUNCTION memories_context_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    row_ memories;
BEGIN
    row_ := CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    -- One writer per user at a time; the statements below then see the other writers' committed rows.
    PERFORM pg_advisory_xact_lock(hashtext('yak_exchange_context'), hashtext(row_.user_id));
    PERFORM yak_refresh_exchange_context(ARRAY[
        row_.id,
        yak_exchange_neighbour(row_.user_id, row_.occurred_at, row_.seq, true),
        yak_exchange_neighbour(row_.user_id, row_.occurred_at, row_.seq, false)]);
    IF TG_OP = 'UPDATE' AND (OLD.occurred_at IS DISTINCT FROM NEW.occurred_at) THEN
        -- The exchange moved: its old neighbours lose it too.
        PERFORM yak_refresh_exchange_context(ARRAY[
            yak_exchange_neighbour(OLD.user_id, OLD.occurred_at, OLD.seq, true),
            yak_exchange_neighbour(OLD.user_id, OLD.occurred_at, OLD.seq, false)]);
    END IF;
    RETURN NULL;
END
$$;

-- Only the columns that change a context fire it: the trigger's own UPDATE (context_tsv) does not.
CREATE TRIGGER memories_context AFTER INSERT OR DELETE OR UPDATE OF content, occurred_at, deleted_at ON memories
    FOR EACH ROW EXECUTE FUNCTION memories_context_trigger();

-- Every context of one user (or of all users) at once, from the same neighbours the trigger
-- picks: the migration fills existing rows with it, and `yak db index --rebuild-context` repairs with it.
CREATE FUNCTION yak_rebuild_exchange_context(p_user text DEFAULT NULL) RETURNS bigint LANGUAGE sql AS $$
    WITH w AS (
        SELECT id,
               CASE WHEN lag(occurred_at) OVER t >= occurred_at - yak_context_gap()
                    THEN lag(content) OVER t END AS prev_content,
               CASE WHEN lead(occurred_at) OVER t <= occurred_at + yak_context_gap()
                    THEN lead(content) OVER t END AS next_content
          FROM memories WHERE deleted_at IS NULL AND (p_user IS NULL OR user_id = p_user)
        WINDOW t AS (PARTITION BY user_id ORDER BY occurred_at, seq)
    ), changed AS (
        UPDATE memories m
           SET context_tsv = to_tsvector('english', concat_ws(E'\n', w.prev_content, m.content, w.next_content))
          FROM w WHERE w.id = m.id
        RETURNING 1
    )
    SELECT count(*) FROM changed
$$;

SELECT yak_rebuild_exchange_context();
