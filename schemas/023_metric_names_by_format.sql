-- Metric names keyed by the format whose files logged the key: two formats may give one key two meanings.
-- A row is (format, key, canonical); the format `*` holds the keys every format names alike, read for a
-- file whose format names the key not. The rows, like the `named_step_metrics` and `steps` views that read
-- them, are written from the formats' declarations when a store is opened (store/catalog.py), never here:
-- an older store's rows, keyed by the key alone, are dropped with their table and written again.
DROP TABLE metric_aliases;
CREATE TABLE metric_aliases (
    format     VARCHAR NOT NULL,
    key        VARCHAR NOT NULL,
    canonical  VARCHAR NOT NULL,
    PRIMARY KEY (format, key)
);
