"""AReaL's perf tracer: `traces-r{rank}.jsonl` and `sessions-r{rank}.jsonl`.

Layout from AReaL's `areal/utils/perf_tracer.py` and `docs/en/best_practices/perf_profiling.md`:

- `perf_tracer/traces-r{rank}.jsonl`: one Chrome trace event per line (`X` spans from `@trace_perf`
  and `trace_scope`, `i` instants, `M` process and thread names). `ts` is µs since the tracer
  started in that process (`time.perf_counter_ns`), so it is the file's own clock: two ranks' files
  do not line up. `args.rank`, `args.role` and, for scopes given it, `args.global_step` say who and
  when.
- `session_tracer/sessions-r{rank}.jsonl`: one rollout session (one sample) per line: `task_id`,
  `session_id`, `rank`, `status` (accepted, rejected, failed, dropped, pending), `reason`,
  `submit_ts`, `finalized_ts` (seconds since the Unix epoch, `time.time()`), the derived
  `total_s`, `generate_s`, `reward_s`, `toolcall_s`, and `phases`: per phase a list of
  `{start_ts, end_ts}`. A session becomes one span from submit to finalize (or its last phase's end
  when it was never finalized), each phase execution one span inside it, on the lane `session <id>`.
"""

from __future__ import annotations

import re

from polytrace_cli.ingest.base import FileContext, JsonlTraceIngester
from polytrace_cli.ingest.formats.areal import names
from polytrace_cli.ingest.trace_events.spans import EventTables, SpanSource, read_line_pieces
from polytrace_cli.ingest.trace_events.pieces import line_pieces
from polytrace_cli.ingest.jsonl import Check, load_records
from polytrace_cli.ingest.registry import register

TRACES_NAME = re.compile(r"^traces-r(?P<rank>\d+)\.jsonl$")
SESSIONS_NAME = re.compile(r"^sessions-r(?P<rank>\d+)\.jsonl$")


@register
class ArealTracesIngester(JsonlTraceIngester):
    name = "areal-traces"
    version = "1"
    framework = "areal"
    description = "AReaL perf tracer traces-r{rank}.jsonl (trace events per line, the process's own clock)"
    file_name = TRACES_NAME
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def load(self, ctx: FileContext) -> None:
        match = TRACES_NAME.match(ctx.path.name)
        source = SpanSource(rank=int(match.group("rank")) if match else None, sources_are_lines=True)
        tables = EventTables(ctx, source)
        read_line_pieces(ctx, tables, line_pieces(ctx.path))
        tables.finish()


SESSION_SPEC = {
    "task_id": "BIGINT",
    "session_id": "BIGINT",
    "rank": "INTEGER",
    "status": "VARCHAR",
    "reason": "VARCHAR",
    "submit_ts": "DOUBLE",
    "finalized_ts": "DOUBLE",
    "total_s": "DOUBLE",
    "generate_s": "DOUBLE",
    "reward_s": "DOUBLE",
    "toolcall_s": "DOUBLE",
    "phases": "JSON",
}
SESSION_CHECKS = (Check("finalized_ts < submit_ts", "finalized before it was submitted"),)


@register
class ArealSessionsIngester(JsonlTraceIngester):
    name = "areal-sessions"
    version = "1"
    framework = "areal"
    description = "AReaL session tracer sessions-r{rank}.jsonl (per-sample submit, phases, finalize, status)"
    file_name = SESSIONS_NAME
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def load(self, ctx: FileContext) -> None:
        records = load_records(ctx, SESSION_SPEC, ("session_id", "submit_ts"), SESSION_CHECKS)
        match = SESSIONS_NAME.match(ctx.path.name)
        file_rank = int(match.group("rank")) if match else None
        con = ctx.con
        stages = names.PHASE_STAGES
        con.execute(
            """
            CREATE OR REPLACE TEMP TABLE _areal_phases AS
            WITH keyed AS (
                SELECT row_number() OVER () AS record, * FROM records),
            phase_lists AS (
                SELECT record, session_id, task_id, rank, unnest(json_keys(phases)) AS phase, phases FROM keyed
                WHERE phases IS NOT NULL AND json_type(phases) = 'OBJECT'),
            executions AS (
                SELECT record, session_id, task_id, rank, phase,
                       unnest(from_json(json_extract(phases, '$."' || phase || '"'),
                                        '[{"start_ts": "DOUBLE", "end_ts": "DOUBLE"}]')) AS run
                FROM phase_lists)
            SELECT record, session_id, task_id, rank, phase, run.start_ts AS t0, run.end_ts AS t1 FROM executions
            WHERE run.start_ts IS NOT NULL
            """)
        con.execute(
            """CREATE OR REPLACE TEMP TABLE _areal_sessions AS
               WITH keyed AS (SELECT row_number() OVER () AS record, * FROM records)
               SELECT k.*, p.last_end FROM keyed k
               LEFT JOIN (SELECT record, max(coalesce(t1, t0)) AS last_end FROM _areal_phases GROUP BY record) p USING (record)""")
        stage_case = " ".join(f"WHEN '{phase}' THEN '{stage}'" for phase, stage in stages.items())
        ctx.insert(
            """
            INSERT INTO spans (run_id, file_id, step, rank, role, lane, name, stage, t0_us, t1_us, clock, wall_t0_us,
                               status, detail, source_event, synthesized)
            SELECT ?, ?, NULL, coalesce(rank, ?), 'rollout', 'session ' || session_id, 'session', NULL,
                   submit_ts * 1e6, greatest(coalesce(finalized_ts, last_end, submit_ts), submit_ts) * 1e6, 'wall',
                   submit_ts * 1e6, status, reason, record, false
            FROM _areal_sessions
            """, [ctx.run_id, ctx.file_id, file_rank])
        ctx.insert(
            f"""
            INSERT INTO spans (run_id, file_id, step, rank, role, lane, name, stage, t0_us, t1_us, clock, wall_t0_us,
                               source_event, synthesized)
            SELECT ?, ?, NULL, coalesce(rank, ?), 'rollout', 'session ' || session_id, phase,
                   CASE phase {stage_case} END, t0 * 1e6, greatest(coalesce(t1, t0), t0) * 1e6, 'wall', t0 * 1e6,
                   record, false
            FROM _areal_phases
            """, [ctx.run_id, ctx.file_id, file_rank])
        con.execute("DROP TABLE _areal_phases")
        con.execute("DROP TABLE _areal_sessions")
        ctx.stored = records

