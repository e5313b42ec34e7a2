-- The profile (issue 39): the user's standing instructions and preferences, one row per sentence
-- of the user's side of an exchange that states one (``core.profile.profile_statements``), written
-- with the exchange (``store.memories.insert_memory``; a grown exchange's are written again) and
-- carried by the memory block on every turn. Rows follow their exchange: forgotten with it
-- (soft: read paths join the live exchange; hard: the cascade), restored by re-reading it.
-- Existing exchanges are read once, in Python, when this migration is applied (store.migrations).

CREATE TABLE profile_lines (
    id         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    memory_id  uuid NOT NULL,
    user_id    text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('instruction', 'preference')),
    content    text NOT NULL CHECK (length(btrim(content)) > 0),
    -- The sentence's place in the user's message.
    position   integer NOT NULL CHECK (position >= 0),
    -- 'dropped': the user took it out of the profile; the exchange stays a memory, recallable.
    status     text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'dropped')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT profile_lines_memory_fk FOREIGN KEY (memory_id, user_id)
        REFERENCES memories (id, user_id) ON DELETE CASCADE,
    CONSTRAINT profile_lines_memory_position_unique UNIQUE (memory_id, position)
);
CREATE INDEX profile_lines_user_idx ON profile_lines (user_id) WHERE status = 'active';
