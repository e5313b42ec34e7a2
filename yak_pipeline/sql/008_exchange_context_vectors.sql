-- Exchange context by meaning (issue "Recall that understands").
--
-- sql/006 lets recall's text leg search each exchange with its neighbours in the conversation;
-- this does the same for meaning. "In the bathroom, Aiko is very tolerant." answers "Where do I
-- develop my photos?" only next to the question it replies to. Each live exchange gets a
-- second vector: of its text between its previous and next exchange's (the same neighbours
-- as context_tsv, sql/006). Measured with all-MiniLM-L6-v2 as dense search over
-- single turns, cosine(turn) + 0.5 × cosine(turn in context) against cosine(turn) alone: R@10
-- 0.872 → 0.906 on the paraphrase dev file, 0.461 → 0.542 on LoCoMo dev (docs/RECALL.md).
--
-- The vector is filled after ingestion (services.recall.embed_pending_exchanges), like the
-- exchange's own vector (sql/004). Whenever the trigger of sql/006 gives an exchange a new
-- context (a neighbour arrived, moved or was forgotten), its context vector is cleared, so a
-- stale vector is never compared and a forgotten exchange's words stop counting at once.
-- The text is the conversation in order, as the dense measurement above read it (own text
-- first measured worse: 0.894 and 0.520). The embedder reads a bounded number of tokens
-- (256 word pieces for all-MiniLM-L6-v2), so each neighbour contributes at most its 400
-- characters nearest the exchange: a long previous answer must not push the exchange itself
-- out of what the model reads.

ALTER TABLE memories
    ADD COLUMN context_embedding       vector({{EMBEDDING_DIM}}),
    ADD COLUMN context_embedding_model text;

CREATE INDEX memories_context_embedding_hnsw ON memories USING hnsw (context_embedding vector_cosine_ops);
-- Finds the exchanges whose context still waits for a vector without scanning everyone's rows.
CREATE INDEX memories_context_unembedded_idx ON memories (user_id)
    WHERE context_embedding IS NULL AND deleted_at IS NULL;

-- The text a context vector is made of: the previous live exchange's end, the exchange, the
-- next one's start (the neighbours of sql/006), one per line.
CREATE FUNCTION yak_exchange_context_text(p_id uuid) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT concat_ws(E'\n',
               (SELECT right(content, 400) FROM memories p
                 WHERE p.id = yak_exchange_neighbour(m.user_id, m.occurred_at, m.seq, true)),
               m.content,
               (SELECT left(content, 400) FROM memories n
                 WHERE n.id = yak_exchange_neighbour(m.user_id, m.occurred_at, m.seq, false)))
      FROM memories m WHERE m.id = p_id
$$;

-- As in sql/006, and a changed context clears the context vector.
CREATE OR REPLACE FUNCTION yak_refresh_exchange_context(ids uuid[]) RETURNS void LANGUAGE sql AS $$
    UPDATE memories m
       SET context_tsv = c.tsv,
           context_embedding = CASE WHEN m.context_tsv IS NOT DISTINCT FROM c.tsv THEN m.context_embedding END,
           context_embedding_model = CASE WHEN m.context_tsv IS NOT DISTINCT FROM c.tsv
                                          THEN m.context_embedding_model END
      FROM (SELECT x.id, to_tsvector('english', concat_ws(E'\n',
                       (SELECT content FROM memories p
                         WHERE p.id = yak_exchange_neighbour(x.user_id, x.occurred_at, x.seq, true)),
                       x.content,
                       (SELECT content FROM memories n
                         WHERE n.id = yak_exchange_neighbour(x.user_id, x.occurred_at, x.seq, false)))) AS tsv
              FROM memories x WHERE x.id = ANY(ids) AND x.deleted_at IS NULL) c
     WHERE m.id = c.id
$$;

CREATE OR REPLACE FUNCTION yak_rebuild_exchange_context(p_user text DEFAULT NULL) RETURNS bigint LANGUAGE sql AS $$
    WITH w AS (
        SELECT id,
               CASE WHEN lag(occurred_at) OVER t >= occurred_at - yak_context_gap()
                    THEN lag(content) OVER t END AS prev_content,
               CASE WHEN lead(occurred_at) OVER t <= occurred_at + yak_context_gap()
                    THEN lead(content) OVER t END AS next_content
          FROM memories WHERE deleted_at IS NULL AND (p_user IS NULL OR user_id = p_user)
        WINDOW t AS (PARTITION BY user_id ORDER BY occurred_at, seq)
    ), fresh AS (
        SELECT w.id, to_tsvector('english', concat_ws(E'\n', w.prev_content, m.content, w.next_content)) AS tsv
          FROM w JOIN memories m ON m.id = w.id
    ), changed AS (
        UPDATE memories m
           SET context_tsv = f.tsv,
               context_embedding = CASE WHEN m.context_tsv IS NOT DISTINCT FROM f.tsv THEN m.context_embedding END,
               context_embedding_model = CASE WHEN m.context_tsv IS NOT DISTINCT FROM f.tsv
                                              THEN m.context_embedding_model END
          FROM fresh f WHERE f.id = m.id
        RETURNING 1
    )
    SELECT count(*) FROM changed
$$;
