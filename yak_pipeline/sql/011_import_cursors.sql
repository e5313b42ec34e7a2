-- History import (issue 14): how far each Claude Code session transcript has been read.
--
-- A session's transcript grows when the session is resumed. Re-importing it reads only what
-- was appended since: from `resume_at`, provided the file's first `resume_at` bytes are still
-- the ones read before (`prefix_sha256`); a file rewritten in between is read whole again, and
-- the content hash keeps every exchange stored once. Exchanges forgotten since the last import
-- therefore do not come back when the grown file is imported again.

CREATE TABLE import_cursors (
    user_id       text NOT NULL CHECK (user_id ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    -- What was read: 'claude-code:<sessionId>'.
    source_key    text NOT NULL CHECK (length(source_key) BETWEEN 1 AND 300),
    resume_at     bigint NOT NULL CHECK (resume_at >= 0),
    prefix_sha256 text NOT NULL CHECK (prefix_sha256 ~ '^[0-9a-f]{64}$'),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, source_key)
);
