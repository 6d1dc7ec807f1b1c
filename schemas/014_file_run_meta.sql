-- What each file gave its run's `meta` (`ingest.runner.merge_run_meta`). A run's meta is the fold of
-- its files' rows in the order they were read (file_id), so a file read again (grown, replaced)
-- changes the run's meta as reading the final files once would: the facts its earlier text gave do
-- not stay behind. A store made before this table keeps its runs' meta as one row without a file,
-- folded first.
CREATE TABLE IF NOT EXISTS file_run_meta (
    file_id  INTEGER,          -- NULL: the run's meta from before this table existed
    run_id   INTEGER NOT NULL,
    meta     JSON NOT NULL
);

INSERT INTO file_run_meta (file_id, run_id, meta)
SELECT NULL, run_id, meta FROM runs WHERE meta IS NOT NULL AND CAST(meta AS VARCHAR) NOT IN ('{}', 'null');
