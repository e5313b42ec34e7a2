-- Hybrid recall (issue 5) searches the raw exchanges by meaning as well as by words: a
-- distillation can lose the words or the sense a later question uses ("User went to a support
-- group" no longer says who spoke), and the exchange it came from still has them.
-- The vector is filled after ingestion (services.recall.embed_pending_exchanges); rows without
-- one, or with another model's, are simply not vector candidates, never compared across models.

ALTER TABLE memories
    ADD COLUMN embedding       vector({{EMBEDDING_DIM}}),
    ADD COLUMN embedding_model text;

CREATE INDEX memories_embedding_hnsw ON memories USING hnsw (embedding vector_cosine_ops);
-- Finds the exchanges still waiting for a vector without scanning the user's whole history.
CREATE INDEX memories_unembedded_idx ON memories (user_id) WHERE embedding IS NULL AND deleted_at IS NULL;
