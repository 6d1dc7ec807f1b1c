-- What a file's next ingest needs to read only the bytes appended since this one.
--   complete_bytes: the bytes up to and including the last newline that were read (a line without
--                   its newline yet is read again whole when it is finished);
--   resume_state:   JSON the format's reader carries from one part of the file to the next (NULL
--                   when the format is always read whole).
ALTER TABLE files ADD COLUMN complete_bytes BIGINT;
ALTER TABLE files ADD COLUMN resume_state JSON;
