"""PyTorch profiler (Kineto) traces, as verl's torch profiler and the rollout engines write them.

The file is a Chrome trace in the object format. Timestamps are µs after `baseTimeNanoseconds`
(written after the event array), so `ts + baseTimeNanoseconds / 1000` is wall clock and the ranks'
files line up; `distributedInfo` gives the rank and world size. The ranges are the
`record_function` ranges (`cat` user_annotation; their GPU side on a stream, gpu_user_annotation);
CPU operators are counted, not stored; kernels are summed into the ranges that launched them.

Who wrote the file is read from its name and folder:

- verl's grammar `[<role>_][<scope>_][step<S>_]rank<r>[-of-<world>][_tp<a>-pp<b>-dp<c>-cp<d>]_pid<pid>_<timestamp>.json[.gz]`
  (one file per rank and, in discrete mode, per step);
- verl's older `<save_path>/<role>/[<prefix>_]prof_rank-<r>.json.gz`
  (`verl/utils/profiler/torch_profile.py`, `get_torch_profiler`);
- rollout replicas: any `*.json[.gz]` under `agent_loop_rollout_replica_<n>/` (the folder verl gives
  the vLLM or SGLang engine), or moved up and renamed `rollout-replica<n>[-globalrank<g>]_<name>`;
  the engine's own `rank<t>`, `-rank-<t>.` or `-TP-<t>.` in the name is the replica's tensor rank.
"""

from __future__ import annotations

import re
from pathlib import Path

from polytrace_cli.errors import IngestError
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.formats.traces import names
from polytrace_cli.ingest.trace_events.spans import EventTables, SpanSource, finish_pieces, role_in
from polytrace_cli.ingest.trace_events.pieces import TracePieces
from polytrace_cli.ingest.registry import register

VERL_NAME = re.compile(
    r"^(?:(?P<prefix>[A-Za-z][A-Za-z0-9_]*?)_)?(?:step(?P<step>\d+)_)?rank(?P<rank>\d+)(?:-of-(?P<world>\d+))?"
    r"(?:_(?P<parallel>(?:[a-z]+\d+-?)+))?_pid(?P<pid>\d+)_(?P<stamp>\d+)\.json$")
OLD_VERL_NAME = re.compile(r"^(?:(?P<prefix>.+)_)?prof_rank-(?P<rank>\d+)\.json$")
REPLICA_FOLDER = re.compile(r"^agent_loop_rollout_replica_(?P<replica>\d+)$")
RELOCATED_REPLICA = re.compile(r"^rollout-replica(?P<replica>\d+)(?:-globalrank(?P<global>\d+))?_(?P<rest>.+\.json)$")
ENGINE_RANK = re.compile(r"(?:^|[-_.])(?:rank-?|TP-)(?P<tp>\d+)(?:[-_.]|$)")
TRACE_SUFFIX = re.compile(r"\.(pt\.)?trace\.json$|\.json$")


def file_facts(path: Path) -> SpanSource:
    """What the file's name and folder say of its role, rank, parallel ranks and step."""
    source = SpanSource(clock="wall", operators_are_ranges=False)
    name = path.name
    replica_folder = REPLICA_FOLDER.match(path.parent.name)
    relocated = RELOCATED_REPLICA.match(name)
    if replica_folder or relocated:
        source.role = "rollout"
        source.replica = int((replica_folder or relocated).group("replica"))
        engine_name = relocated.group("rest") if relocated else name
        engine_rank = ENGINE_RANK.search(engine_name)
        if engine_rank:
            source.tp_rank = int(engine_rank.group("tp"))
        if relocated and relocated.group("global"):
            source.rank = int(relocated.group("global"))
        return source
    match = VERL_NAME.match(name)
    if match:
        prefix = match.group("prefix") or ""
        first = prefix.split("_", 1)[0]
        source.role = role_in(first) or (role_in(prefix) if prefix else None)
        source.rank = int(match.group("rank"))
        if match.group("step"):
            source.step = int(match.group("step"))
        for part in (match.group("parallel") or "").split("-"):
            kind = re.fullmatch(r"(tp|pp|dp|cp)(\d+)", part)
            if kind:
                setattr(source, f"{kind.group(1)}_rank", int(kind.group(2)))
        source.extra["world"] = int(match.group("world")) if match.group("world") else None
        return source
    old = OLD_VERL_NAME.match(name)
    if old:
        source.rank = int(old.group("rank"))
        source.role = role_in(path.parent.name) or role_in(old.group("prefix"))
    return source


def _is_kineto(head: bytes) -> bool:
    window = head[:16384]
    return b'"traceEvents"' in head and (b'"schemaVersion"' in window or b'"deviceProperties"' in window
                                         or b'"distributedInfo"' in window)


@register
class KinetoTraceIngester(Ingester):
    name = "pytorch-profiler"
    version = "1"
    framework = None
    description = "PyTorch profiler (Kineto) trace, .json or .json.gz: record_function ranges per rank, kernels summed"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        if not TRACE_SUFFIX.search(path.name):
            return False
        return _is_kineto(head)

    def load(self, ctx: FileContext) -> None:
        source = file_facts(ctx.path)
        pieces = TracePieces(ctx.path)
        tables = EventTables(ctx, source)
        tables.add_pieces(pieces)
        if pieces.problem and not tables.events:
            raise IngestError(f"not a readable PyTorch profiler trace: {pieces.problem}")
        outer = pieces.outer
        base = outer.get("baseTimeNanoseconds")
        if isinstance(base, (int, float)) and not isinstance(base, bool):
            source.offset_us = base / 1000.0
        else:
            # Kineto before `baseTimeNanoseconds` wrote µs since the epoch in `ts` itself.
            source.offset_us = 0.0
        info = outer.get("distributedInfo") or {}
        if source.replica is not None:
            # A replica's engine traces are ranked by the replica: its own process group is not the trainer's.
            source.rank = source.rank if source.rank is not None else source.replica
        elif source.rank is None and isinstance(info, dict) and isinstance(info.get("rank"), int):
            source.rank = info["rank"]
        finish_pieces(ctx, tables, pieces)
