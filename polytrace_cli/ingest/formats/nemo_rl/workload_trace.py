"""NeMo-RL's workload trace (`NEMORL_TRACE_ENABLED=1`, written to `NEMORL_TRACE_FILE`, by default
`nemorl_trace.json`).

Layout from NeMo-RL's `nemo_rl/utils/trace.py`: a JSON array (the array format) of trace events
sorted by `ts`. Synchronous spans are `B`/`E` pairs on the tracer's thread (`step` with
`args.step`, and inside it `generation`, `training`, ...); overlapping async spans (one per sample)
are `X` events each on a virtual thread of its own; `C` counters and `i` instants carry
`args.tracer_name`. Timestamps are `time.monotonic()` in µs (not wall clock): the driver moves each
actor's events onto its own clock before writing, so the file is one clock, its own. A span
without `args.step` takes the step of the `step` span that holds it.
"""

from __future__ import annotations

from pathlib import Path

from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.formats.nemo_rl import names
from polytrace_cli.ingest.trace_events.spans import EventTables, SpanSource, finish_pieces
from polytrace_cli.ingest.trace_events.pieces import TracePieces
from polytrace_cli.ingest.registry import register


@register
class NemoRlTraceIngester(Ingester):
    name = "nemo-rl-trace"
    version = "1"
    framework = "nemo_rl"
    description = "NeMo-RL workload trace (nemorl_trace.json: Perfetto trace events with tracer_name)"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return (path.name.endswith(".json") and head.lstrip().startswith(b"[")
                and b'"tracer_name"' in head[:65536] and b'"ph"' in head[:65536])

    def load(self, ctx: FileContext) -> None:
        pieces = TracePieces(ctx.path)
        tables = EventTables(ctx, SpanSource())
        tables.add_pieces(pieces)
        finish_pieces(ctx, tables, pieces)
