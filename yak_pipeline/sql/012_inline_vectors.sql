-- Vectors stay inside their row (storage MAIN) instead of the TOAST table.
--
-- An exchange row holds its text, two tsvectors and two 384-dimensional vectors (1.5 kB each):
-- past the 2 kB TOAST threshold PostgreSQL moved the vectors out of line (every one of the 2,760
-- exchanges of the LoCoMo evaluation database), so the exact scan recall runs for a user with up
-- to 2,000 rows read the TOAST table row by row: 2,402 buffers and 2.79 ms p50 for 600 exchanges,
-- against 602 buffers and 1.19 ms with the vectors in the row (bench/vector_storage.py,
-- docs/BENCHMARKS.md §2c). With MAIN the text and the tsvectors go out of line first.
ALTER TABLE memories ALTER COLUMN embedding SET STORAGE MAIN,
                     ALTER COLUMN context_embedding SET STORAGE MAIN;
ALTER TABLE distillations ALTER COLUMN embedding SET STORAGE MAIN;

-- Existing rows keep their out-of-line vectors until rewritten: a cast through text makes a new
-- value of the same numbers (pgvector prints the shortest text that reads back exactly), which is
-- then stored by the new rule. Only the vector
-- columns change, so no trigger of the exchange context (sql/006) fires; on a database of
-- hundreds of thousands of exchanges this takes minutes (the HNSW indexes take the new rows).
-- PostgreSQL 17+ tells which values are out of line (pg_column_toast_chunk_id); on 16 every
-- vector is rewritten.
DO $$
DECLARE
    target record;
    only_out_of_line text := '';
BEGIN
    FOR target IN SELECT * FROM (VALUES ('memories', 'embedding'), ('memories', 'context_embedding'),
                                        ('distillations', 'embedding')) AS t(tbl, col)
    LOOP
        IF current_setting('server_version_num')::int >= 170000 THEN
            only_out_of_line := format(' AND pg_column_toast_chunk_id(%I) IS NOT NULL', target.col);
        END IF;
        EXECUTE format('UPDATE %I SET %I = %I::text::vector WHERE %I IS NOT NULL',
                       target.tbl, target.col, target.col, target.col) || only_out_of_line;
    END LOOP;
END $$;
