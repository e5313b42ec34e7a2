-- BM25's statistics kept beside its postings, so a query counts nothing it could look up
-- (issue "Fast on the default path", part 2; store/recall.py).
--
-- From the postings alone (sql/013) a query still counted, each time, every one of the user's
-- rows (the corpus size and mean length: an index-only scan of about 10,000 entries, 1.4 ms) and
-- every posting of each query word (its document frequency) before it could score one row. Here
-- those counts are kept per (leg, user, scope, word), and per (leg, user, scope) for the corpus
-- (lexeme ''; no word is empty): at 100,000 realistic rows of ten users that took the distillation
-- leg from 3.4-5.1 to 1.6-2.3 ms p50 and the exchanges-in-context leg from 5.8-6.6 to 4.2-4.5, the
-- same scores for all 200 questions (docs/BENCHMARKS.md §2f).
--
-- Nothing here updates a row in place (sql/013 says why: a long import in one transaction would
-- rewrite one counter tens of thousands of times). Each write appends its *deltas*, one row per
-- (user, scope, word) it touched and one for the corpus, signed, and a reader sums them; so
-- concurrent writers never wait on each other here. ``yak_bm25_fold_statistics`` folds each
-- key's deltas into one row (the nightly recall_index_job, `yak db index`, the end of
-- `yak process`), which keeps the sums short; a reader's result is the same folded or not.

CREATE TABLE bm25_statistics (
    leg     text   NOT NULL,
    user_id text   NOT NULL,
    scope   text   NOT NULL,
    lexeme  text   NOT NULL,            -- '' = the corpus: every row that counts, with or without words
    df      bigint NOT NULL,            -- rows: holding the word, or (corpus) all of them
    dl_sum  bigint NOT NULL DEFAULT 0,  -- corpus: the sum of the rows' lengths
    dl_rows bigint NOT NULL DEFAULT 0   -- corpus: the rows whose length is known (avg() skips NULL)
);
CREATE INDEX bm25_statistics_key_idx ON bm25_statistics (leg, user_id, scope, lexeme) INCLUDE (df, dl_sum, dl_rows);

-- sql/013's function keeps the postings under another name; yak_bm25_apply, which the triggers
-- call, now runs it and appends the statistics' deltas of the same rows.
ALTER FUNCTION yak_bm25_apply(text, uuid[], text[], text[], int[], tsvector[], int[]) RENAME TO yak_bm25_apply_postings;

CREATE FUNCTION yak_bm25_apply(p_leg text, p_ids uuid[], p_users text[], p_scopes text[], p_signs int[],
                               p_tsvs tsvector[], p_terms int[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- With no rows (NULL arrays: a statement that changed none that count) nothing is appended.
    PERFORM yak_bm25_apply_postings(p_leg, p_ids, p_users, p_scopes, p_signs, p_tsvs, p_terms);
    -- Statistics: each word's rows, then the corpus, as signed deltas.
    INSERT INTO bm25_statistics (leg, user_id, scope, lexeme, df)
    SELECT p_leg, d.u, d.s, w.lexeme, sum(d.sign)
      FROM unnest(p_users, p_scopes, p_signs, p_tsvs) AS d(u, s, sign, tsv)
     CROSS JOIN LATERAL unnest(tsvector_to_array(d.tsv)) AS w(lexeme)
     GROUP BY d.u, d.s, w.lexeme
    HAVING sum(d.sign) <> 0;
    INSERT INTO bm25_statistics (leg, user_id, scope, lexeme, df, dl_sum, dl_rows)
    SELECT p_leg, d.u, d.s, '', sum(d.sign), coalesce(sum(d.sign * d.terms), 0),
           sum(CASE WHEN d.terms IS NOT NULL THEN d.sign ELSE 0 END)
      FROM unnest(p_users, p_scopes, p_signs, p_terms) AS d(u, s, sign, terms)
     GROUP BY d.u, d.s
    HAVING sum(d.sign) <> 0 OR coalesce(sum(d.sign * d.terms), 0) <> 0
        OR sum(CASE WHEN d.terms IS NOT NULL THEN d.sign ELSE 0 END) <> 0;
END
$$;

-- Every key's deltas summed into one row; keys that sum to nothing go. One folder at a time;
-- writers go on meanwhile (a delta written after this statement's snapshot is not touched and
-- still counts). Returns the rows removed.
CREATE FUNCTION yak_bm25_fold_statistics() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    removed bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('yak_bm25_fold_statistics'));
    WITH folded AS (
        SELECT leg, user_id, scope, lexeme FROM bm25_statistics
         GROUP BY leg, user_id, scope, lexeme
        HAVING count(*) > 1 OR (sum(df) = 0 AND sum(dl_sum) = 0 AND sum(dl_rows) = 0)
    ), gone AS (
        DELETE FROM bm25_statistics s USING folded f
         WHERE s.leg = f.leg AND s.user_id = f.user_id AND s.scope = f.scope AND s.lexeme = f.lexeme
        RETURNING s.*
    ), kept AS (
        INSERT INTO bm25_statistics (leg, user_id, scope, lexeme, df, dl_sum, dl_rows)
        SELECT leg, user_id, scope, lexeme, sum(df), sum(dl_sum), sum(dl_rows) FROM gone
         GROUP BY leg, user_id, scope, lexeme
        HAVING sum(df) <> 0 OR sum(dl_sum) <> 0 OR sum(dl_rows) <> 0
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone) - (SELECT count(*) FROM kept) INTO removed;
    RETURN removed;
END
$$;

-- The statistics recounted from the postings and the rows (what the deltas must sum to).
CREATE FUNCTION yak_bm25_count_statistics() RETURNS void LANGUAGE sql AS $$
    DELETE FROM bm25_statistics;
    INSERT INTO bm25_statistics (leg, user_id, scope, lexeme, df)
    SELECT leg, user_id, scope, lexeme, count(*) FROM bm25_postings GROUP BY leg, user_id, scope, lexeme;
    INSERT INTO bm25_statistics (leg, user_id, scope, lexeme, df, dl_sum, dl_rows)
    SELECT 'distillations', d.user_id, coalesce(d.embedding_model, ''), '', count(*), coalesce(sum(d.content_terms), 0),
           count(d.content_terms)
      FROM distillations d WHERE d.status = 'active' AND d.deleted_at IS NULL
     GROUP BY d.user_id, coalesce(d.embedding_model, '')
    UNION ALL
    SELECT 'contexts', m.user_id, '', '', count(*), coalesce(sum(m.context_terms), 0), count(m.context_terms)
      FROM memories m WHERE m.deleted_at IS NULL
     GROUP BY m.user_id;
$$;

-- The rebuild (sql/013) recounts the statistics too.
ALTER FUNCTION yak_bm25_rebuild() RENAME TO yak_bm25_rebuild_postings;
CREATE FUNCTION yak_bm25_rebuild() RETURNS void LANGUAGE sql AS $$
    SELECT yak_bm25_rebuild_postings();
    SELECT yak_bm25_count_statistics();
$$;

-- A truncated table's leg has no postings and no statistics.
CREATE OR REPLACE FUNCTION yak_bm25_truncate_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM bm25_postings WHERE leg = TG_ARGV[0];
    DELETE FROM bm25_statistics WHERE leg = TG_ARGV[0];
    RETURN NULL;
END
$$;

SELECT yak_bm25_count_statistics();
