-- Knowledge updates (issue "Recall that understands", part 4).
--
-- When a newer memory replaces what an older one said ("I moved to Porto" after "I live in
-- Lisbon"), the older distillation is marked superseded by the newer one: it is kept, with its
-- versions and audit trail, and still recallable (a question about the past may need it), but
-- recall ranks it below the memory that replaced it and the memory block says it is no longer
-- current. Forgetting the newer memory makes the older current again (ON DELETE SET NULL; a
-- soft-deleted superseder is ignored by recall).

ALTER TABLE distillations
    ADD COLUMN superseded_by uuid REFERENCES distillations (id) ON DELETE SET NULL,
    ADD COLUMN superseded_at timestamptz;

CREATE INDEX distillations_superseded_by_idx ON distillations (superseded_by) WHERE superseded_by IS NOT NULL;
