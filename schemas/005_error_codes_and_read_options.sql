-- A machine-readable kind for every quarantined line or file, beside the human reason:
-- invalid-json, not-an-object, missing-field, type-error, out-of-range, constraint-error,
-- encoding-error, unparsable-line, unreadable-file, unknown-format, binary-file, corrupt-file.
-- NULL for rows written before this column existed.
ALTER TABLE ingest_errors ADD COLUMN code VARCHAR;

-- The options a file was read with that change its rows (e.g. the tokenizer), as text; with the
-- format and parser version it decides whether an unchanged file may be skipped. NULL before this
-- column existed: such files are read again once.
ALTER TABLE files ADD COLUMN read_options VARCHAR;
