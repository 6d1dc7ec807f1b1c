-- What a file's next ingest needs to read only the bytes appended since this one.
--   complete_bytes: the bytes read, when they end with a newline (an appended read may start
--                   there); NULL when the last line read had no newline yet;
--   resume_state:   JSON: what the format's reader carries from one part of the file to the next,
--                   and `block_sha`, the sha256 of the last 64 KB read, which an appended read
--                   requires unchanged; NULL when the file is always read whole.
ALTER TABLE files ADD COLUMN IF NOT EXISTS complete_bytes BIGINT;
ALTER TABLE files ADD COLUMN IF NOT EXISTS resume_state JSON;
