"""A Prometheus range-query export: the JSON `GET /api/v1/query_range` answers.

`{"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {"__name__": ...,
<labels>}, "values": [[<unix seconds>, "<value>"], ...]}, ...]}}`. Each series' `__name__` is its
exposed name (a query on a bare series keeps it; a computed expression drops it, and such a series is
rejected: polytrace cannot tell what it measures). Values are strings (`"NaN"`, `"+Inf"` included).

The accounting unit is the sample: stored in `engine_metrics`, ignored (NaN, histogram buckets), or
rejected with the series' index and the sample's position in its `line_no` (series × 1,000,000 + sample).
"""

from __future__ import annotations

import json
from pathlib import Path

from polytrace_cli.lazy import polars as pl

from polytrace_cli.errors import ErrorCode, IngestError
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.formats.prometheus.scrape import FINITE_LIMIT, engine_expr, store_samples
from polytrace_cli.ingest.registry import register

SAMPLES_PER_SERIES = 1_000_000
# A range-query answer is held whole while it is read; beyond this size it is refused with one line.
MAX_BYTES = 512 << 20


@register
class PrometheusRangeQueryIngester(Ingester):
    name = "prometheus-range"
    version = "1"
    framework = None
    description = "Prometheus range-query export (query_range JSON, resultType matrix) of engine series"

    def sniff(self, path: Path, head: bytes) -> bool:
        window = head[:4000]
        return window.lstrip().startswith(b"{") and b'"resultType"' in window and b'"matrix"' in window

    def load(self, ctx: FileContext) -> None:
        size = ctx.path.stat().st_size
        if size > MAX_BYTES:
            raise IngestError(f"a range-query export of {size >> 20} MB is beyond the {MAX_BYTES >> 20} MB read "
                              "whole; export shorter ranges", code=ErrorCode.UNREADABLE_FILE)
        try:
            document = json.loads(ctx.path.read_bytes())
        except (ValueError, RecursionError) as error:
            raise IngestError(f"not a JSON document: {error}", code=ErrorCode.INVALID_JSON) from None
        result = (document.get("data") or {}).get("result") if isinstance(document, dict) else None
        if not isinstance(result, list):
            raise IngestError("no `data.result` list: not a Prometheus range-query answer", code=ErrorCode.MISSING_FIELD)
        frames: list[pl.DataFrame] = []
        ctx.lines = 0
        for index, series in enumerate(result):
            values = series.get("values") if isinstance(series, dict) else None
            labels = series.get("metric") if isinstance(series, dict) else None
            name = labels.get("__name__") if isinstance(labels, dict) else None
            if not isinstance(values, list) or not isinstance(name, str):
                ctx.lines += 1  # a series that cannot be read counts as one unit, rejected whole
                ctx.reject(index * SAMPLES_PER_SERIES, "a series without `__name__` labels and a `values` "
                           "list: what it measures is unknown", json.dumps(series)[:300], code=ErrorCode.MISSING_FIELD)
                continue
            ctx.lines += len(values)
            if name.endswith(("_bucket", "_created")):
                ctx.ignore("histogram-bucket" if name.endswith("_bucket") else "created-timestamp", len(values))
                continue
            others = {k: v for k, v in labels.items() if k != "__name__"}
            instance = str(others.get("instance", "")) + (f"#{others['engine']}" if "engine" in others else "")
            frames.append(self._series(ctx, index, values).with_columns(
                instance=pl.lit(instance), name=pl.lit(name),
                labels=pl.lit(json.dumps(others, separators=(",", ":")))))
        frame = pl.concat(frames) if frames else pl.DataFrame(
            schema={"line_no": pl.Int64, "ts": pl.Float64, "value": pl.Float64, "instance": pl.String,
                    "name": pl.String, "labels": pl.String})
        store_samples(ctx, frame.with_columns(engine=engine_expr(pl.col("name")))
                      .select("line_no", "ts", "engine", "instance", "name", "labels", "value"))

    @staticmethod
    def _series(ctx: FileContext, index: int, values: list) -> pl.DataFrame:
        """One series' samples (line_no, ts, value) that can be stored; the others ignored or rejected."""
        pairs = pl.DataFrame({"pair": [json.dumps(pair) for pair in values]}).with_row_index("position")
        parsed = pairs.with_columns(
            line_no=pl.col("position").cast(pl.Int64) + index * SAMPLES_PER_SERIES,
            ts=pl.col("pair").str.json_path_match("$[0]").cast(pl.Float64, strict=False),
            value=pl.col("pair").str.json_path_match("$[1]").str.to_lowercase().replace({"+inf": "inf"})
                  .cast(pl.Float64, strict=False),
            pairs=pl.col("pair").str.count_matches(","),
        )
        shaped = (pl.col("pairs") == 1) & pl.col("ts").is_not_null() & pl.col("value").is_not_null()
        for line_no, text in parsed.filter(~shaped).select("line_no", "pair").iter_rows():
            ctx.reject(line_no, "a sample that is not [unix seconds, \"value\"]", text[:300], code=ErrorCode.TYPE_ERROR)
        parsed = parsed.filter(shaped)
        nan = pl.col("value").is_nan()
        ctx.ignore("nan-sample", parsed.filter(nan).height)
        parsed = parsed.filter(~nan)
        huge = (pl.col("value").abs() > FINITE_LIMIT) | (pl.col("ts").abs() > FINITE_LIMIT)
        for line_no, text in parsed.filter(huge).select("line_no", "pair").iter_rows():
            ctx.reject(line_no, "the sample's value is beyond what a double holds", text[:300], code=ErrorCode.OUT_OF_RANGE)
        return parsed.filter(~huge).select("line_no", "ts", "value")
