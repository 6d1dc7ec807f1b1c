"""Chrome trace-event files of any writer: JSON (object or array format, `.json` or `.json.gz`) and
JSON-lines event streams (one event per line).

Every `X` event and every `B`/`E` pair is a span; a process or thread name (`M` events) gives the
role (`ray::WorkerDict` → actor, `vllm` → rollout) and rank (`rank_0`) where it names them, a range's
`args.step` or `args.global_step` its step, else the `step` range of the same file that holds it.
The file's clock is its own (`clock = 'file'`): the trace-event format does not say what `ts`
counts from, so spans of two such files are never lined up against each other.
"""

from __future__ import annotations

import re
from pathlib import Path

from polytrace_cli.errors import IngestError
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.formats.traces import names
from polytrace_cli.ingest.trace_events.spans import EventTables, SpanSource, finish_pieces, read_line_pieces
from polytrace_cli.ingest.trace_events.pieces import TracePieces, line_pieces
from polytrace_cli.ingest.registry import register

_EVENT_START = re.compile(rb'^\s*\[?\s*\{\s*"(ph|name|pid|tid|ts|cat|dur|args)"\s*:')
_PHASE = re.compile(rb'"ph"\s*:\s*"[XBEiIMCbensftPONDR]"')


def looks_like_events(head: bytes) -> bool:
    """True when the first bytes open a trace document or a run of trace events."""
    window = head[:65536]
    if re.search(rb'^\s*\{\s*"traceEvents"\s*:', window) or re.search(rb'"traceEvents"\s*:\s*\[', window):
        return True
    return bool(_EVENT_START.match(window) and _PHASE.search(window))


@register
class ChromeTraceIngester(Ingester):
    name = "chrome-trace"
    version = "1"
    framework = None
    description = "Chrome trace-event JSON (object or array format, .json/.json.gz): X and B/E spans"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return path.name.endswith(".json") and looks_like_events(head)

    def load(self, ctx: FileContext) -> None:
        pieces = TracePieces(ctx.path)
        tables = EventTables(ctx, SpanSource())
        tables.add_pieces(pieces)
        if not pieces.found_events:
            raise IngestError("not a trace-event file: no traceEvents array")
        finish_pieces(ctx, tables, pieces)


@register
class ChromeTraceLinesIngester(Ingester):
    name = "chrome-trace-jsonl"
    version = "1"
    framework = None
    description = "Trace events as JSON lines (.jsonl, one event per line): X and B/E spans"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        if not path.name.endswith((".jsonl", ".ndjson")):
            return False
        first = head.lstrip().split(b"\n", 1)[0]
        return first.startswith(b"{") and bool(_PHASE.search(first)) and b'"ts"' in first

    def load(self, ctx: FileContext) -> None:
        tables = EventTables(ctx, SpanSource(sources_are_lines=True))
        read_line_pieces(ctx, tables, line_pieces(ctx.path))
        tables.finish()
