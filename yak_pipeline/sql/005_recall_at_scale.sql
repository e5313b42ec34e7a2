-- Recall at scale (issue 5, part 3).
--
-- BM25 needs, per query, the number of the user's rows and their average length in lexemes.
-- Computed from content_tsv that means reading every row of the user from the heap (one page
-- per row when users' rows are interleaved: ~10,000 pages for a user with 10,000 rows). The
-- length is kept in its own generated column and copied into a partial index whose keys are
-- the recall filters, so the statistics come from an index-only scan of a few dozen pages.
-- The value is the very one BM25 used before: length(content_tsv), content_tsv being
-- to_tsvector('english', content).
--
-- Per-user HNSW indexes for heavy users are not created here: they depend on the data and are
-- built by store.recall.ensure_user_indexes.

ALTER TABLE distillations
    ADD COLUMN content_terms integer GENERATED ALWAYS AS (length(to_tsvector('english', content))) STORED;
ALTER TABLE memories
    ADD COLUMN content_terms integer GENERATED ALWAYS AS (length(to_tsvector('english', content))) STORED;

-- The recall candidates' filter (DESIGN §4: the user's active rows of the active model).
CREATE INDEX distillations_recall_corpus_idx ON distillations (user_id, embedding_model) INCLUDE (content_terms)
    WHERE status = 'active' AND deleted_at IS NULL;
CREATE INDEX memories_recall_corpus_idx ON memories (user_id) INCLUDE (content_terms)
    WHERE deleted_at IS NULL;
