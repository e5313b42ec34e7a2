-- pgvector 0.8's iterative index scan reads the shared HNSW index filtered to one user as fast
-- as that user's own partial index did (docs/BENCHMARKS.md), so the per-user partial indexes
-- that the nightly recall_index_job built under pgvector 0.6 are dropped; nothing builds them
-- any more. Their names were <table>_hnsw_user_<hash of the user id>.
DO $$
DECLARE
    leftover record;
BEGIN
    FOR leftover IN
        SELECT c.relname FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
        WHERE c.relkind = 'i' AND i.indrelid IN ('distillations'::regclass, 'memories'::regclass)
          AND c.relname ~ '^(distillations|memories)_hnsw_user_[0-9a-f]{16}$'
    LOOP
        EXECUTE format('DROP INDEX %I', leftover.relname);
    END LOOP;
END $$;
