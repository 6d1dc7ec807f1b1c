"""A file of timestamped Prometheus scrapes of inference engines (`polytrace scrape` writes one).

The Prometheus text exposition format, one sample per line: `name{label="v",...} value [timestamp]`,
the timestamp in milliseconds since the epoch; `# HELP` and `# TYPE` lines describe series. Several
scrapes follow one another in the file, each opened by a `# polytrace-scrape url=<address>
ts_ms=<ms>` line (what `polytrace scrape` writes; the address names the engine replica, the time is
every sample's of that scrape that carries none of its own). A sample with neither is rejected: a
value without a time cannot be joined to a step.

Every line is accounted for: a sample is stored in `engine_metrics` (with its canonical name where
`names.py` gives one, else under its own name only); a histogram's `_bucket` and a series' `_created`
lines are ignored by named rules (a window's mean is read from `_sum` and `_count`); comments, blank
lines and scrape markers likewise; a line of another shape, or a value no double holds, is rejected.
"""

from __future__ import annotations

import json
from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console.reading import read_lines
from polytrace_cli.ingest.formats.prometheus.names import canonical_names
from polytrace_cli.ingest.registry import register
from polytrace_cli.ingest.step_rows import store_engine_samples

MARKER = "# polytrace-scrape "
SAMPLE = r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(?:\s+(-?\d+))?\s*$"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"'
ENGINE_PREFIXES = ("vllm:", "sglang:")
# The largest magnitude stored: a value beyond it (or ±inf) is out of range, NaN is kept as no value.
FINITE_LIMIT = 1.7976931348623157e308


def engine_expr(name: pl.Expr) -> pl.Expr:
    """The engine a series name belongs to, from its prefix before ':' (`vllm`, `sglang`); null otherwise."""
    return name.str.extract(r"^([a-zA-Z_][a-zA-Z0-9_]*):", 1)


def store_samples(ctx: FileContext, samples: pl.DataFrame) -> None:
    """Insert `samples` (line_no, ts, engine, instance, name, labels, value) into `engine_metrics`, with
    each series' canonical name; they are the file's stored rows."""
    names = canonical_names()
    frame = samples.with_columns(metric=pl.col("name").replace_strict(names, default=None, return_dtype=pl.String))
    store_engine_samples(ctx, frame, "_engine_samples")
    ctx.stored = frame.height


def labels_json(labels: pl.Expr) -> pl.Expr:
    """The `{a="x",b="y"}` label text as a JSON object's text, `{}` for none, labels in their order.
    Exposition escapes (`\\`, `\"`, `\n`) are JSON's own, so values are copied as written."""
    pairs = labels.fill_null("").str.extract_all(LABEL).list.eval(
        pl.concat_str(pl.lit('"'), pl.element().str.extract(LABEL, 1), pl.lit('":"'),
                      pl.element().str.extract(LABEL, 2), pl.lit('"')))
    return pl.concat_str(pl.lit("{"), pairs.list.join(","), pl.lit("}"))


@register
class PrometheusScrapeIngester(Ingester):
    name = "prometheus-scrape"
    version = "1"
    framework = None
    description = ("Prometheus text-exposition scrapes of rollout engines (vLLM, SGLang) with sample "
                   "timestamps or `# polytrace-scrape` markers, as `polytrace scrape` records them")

    def sniff(self, path: Path, head: bytes) -> bool:
        text = head[:16000].decode("utf-8", "replace")
        if MARKER.strip() in text:
            return True
        lines = [line for line in text.splitlines() if line.strip()]
        return bool(lines) and any(line.startswith("# TYPE ") for line in lines[:20]) and any(
            line.startswith(ENGINE_PREFIXES) for line in lines)

    def load(self, ctx: FileContext) -> None:
        lines = read_lines(ctx.path)
        ctx.lines = lines.height
        raw = pl.col("raw").str.strip_chars_end("\r")
        marker = raw.str.starts_with(MARKER)
        frame = lines.with_columns(
            is_marker=marker,
            scrape_url=pl.when(marker).then(raw.str.extract(r"\burl=(\S+)")),
            scrape_ts=pl.when(marker).then(raw.str.extract(r"\bts_ms=(-?\d+)").cast(pl.Int64, strict=False)),
        ).with_columns(pl.col("scrape_url", "scrape_ts").forward_fill())
        bad_markers = frame.filter(pl.col("is_marker") & pl.col("scrape_ts").is_null())
        for line_no, text in bad_markers.select("line_no", "raw").iter_rows():
            ctx.reject(line_no, "a scrape marker without `ts_ms=<milliseconds>`", text, code=ErrorCode.UNPARSABLE_LINE)
        body = frame.filter(~pl.col("is_marker"))
        stripped = pl.col("raw").str.strip_chars()
        blank = stripped == ""
        comment = stripped.str.starts_with("#")
        ctx.ignore("blank", body.filter(blank).height)
        ctx.ignore("prometheus-comment", body.filter(comment & ~blank).height)
        ctx.ignore("scrape-marker", frame.filter(pl.col("is_marker") & pl.col("scrape_ts").is_not_null()).height)
        candidates = body.filter(~blank & ~comment).with_columns(
            name=stripped.str.extract(SAMPLE, 1),
            label_text=stripped.str.extract(SAMPLE, 2),
            value_text=stripped.str.extract(SAMPLE, 3),
            ts_text=stripped.str.extract(SAMPLE, 4),
        )
        shaped = pl.col("name").is_not_null()
        for line_no, text in candidates.filter(~shaped).select("line_no", "raw").iter_rows():
            ctx.reject(line_no, "not a Prometheus sample `name{labels} value [timestamp]`", text,
                       code=ErrorCode.UNPARSABLE_LINE)
        samples = candidates.filter(shaped)
        bucket = pl.col("name").str.ends_with("_bucket")
        created = pl.col("name").str.ends_with("_created")
        ctx.ignore("histogram-bucket", samples.filter(bucket).height)
        ctx.ignore("created-timestamp", samples.filter(created & ~bucket).height)
        samples = samples.filter(~bucket & ~created).with_columns(
            value=pl.col("value_text").str.to_lowercase().replace({"+inf": "inf"})
                  .cast(pl.Float64, strict=False),
            ts_ms=pl.coalesce(pl.col("ts_text").cast(pl.Int64, strict=False), pl.col("scrape_ts")),
        )
        nan = pl.col("value").is_not_null() & pl.col("value").is_nan()
        ctx.ignore("nan-sample", samples.filter(nan).height)  # a histogram's mean before any observation
        samples = samples.filter(~nan)
        value_bad = pl.col("value").is_null() | (pl.col("value").abs() > FINITE_LIMIT)
        for line_no, text, value in samples.filter(value_bad).select("line_no", "raw", "value").iter_rows():
            if value is None:
                ctx.reject(line_no, "the sample's value is not a number", text, code=ErrorCode.TYPE_ERROR)
            else:
                ctx.reject(line_no, "the sample's value is beyond what a double holds", text, code=ErrorCode.OUT_OF_RANGE)
        samples = samples.filter(~value_bad)
        no_time = pl.col("ts_ms").is_null()
        for line_no, text in samples.filter(no_time).select("line_no", "raw").iter_rows():
            ctx.reject(line_no, "a sample without a timestamp (record scrapes with `polytrace scrape`)", text,
                       code=ErrorCode.MISSING_FIELD)
        samples = samples.filter(~no_time)
        engine_index = pl.col("label_text").str.extract(r'\bengine="([^"]*)"')
        instance = pl.concat_str(
            pl.coalesce(pl.col("label_text").str.extract(r'\binstance="([^"]*)"'), pl.col("scrape_url"),
                        pl.lit("")),
            pl.when(engine_index.is_not_null()).then(pl.lit("#") + engine_index).otherwise(pl.lit("")))
        store_samples(ctx, samples.select(
            "line_no", ts=pl.col("ts_ms") / 1000.0, engine=engine_expr(pl.col("name")), instance=instance,
            name="name", labels=labels_json(pl.col("label_text")), value="value"))


def labels_of(text: str) -> dict[str, str]:
    """The labels of a JSON label text stored in `engine_metrics.labels`."""
    return json.loads(text) if text else {}
