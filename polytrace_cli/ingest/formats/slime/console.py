"""slime's (and miles') console log: the job's stdout, one metrics dict per rollout and side.

Metric lines, after any Ray prefix (`(MegatronTrainRayActor pid=7) `) and logging prefix
(`[2025-10-30 10:00:00] train_metric_utils.py:401 - `; slime 0.1 printed them bare):

    perf 3: {'rollout/response_len/mean': 812.5, ..., 'perf/rollout_time': 98.6, ...}   the rollout side
    rollout 3: {'rollout/log_probs': -0.27, 'rollout/raw_reward': 0.32, ...}            the training side
    perf 3: {'perf/train_wait_time': 101.2, 'perf/train_time': 60.1, 'perf/step_time': 161.3, ...}
    eval 3: {'eval/aime': 0.31, ...}

(slime `slime/observability/rollout_metrics.py` `log_rollout_data`, `log_eval_rollout_data`;
`train_metric_utils.py` `gather_log_data`, `log_perf_data`.) The number is the rollout id, the step
of every view. The payload is a Python dict repr, read with `ast.literal_eval` (numpy scalar reprs
unwrapped). `step K: {'train/loss': ...}` lines count optimizer steps, not rollouts (several per
rollout when the global batch is smaller than the rollout): they are ignored under
`optimizer-step dict` rather than stored on a step axis they do not share.

The two sides print from different processes, and with `train_async.py` the rollout of step N+1
finishes while step N trains, so the rollout side's `perf N+1` line may come before the training
side's `perf N`. A step therefore goes back only within one stream of lines (the rollout side's perf,
the training side's perf, its rollout dicts, evaluations, ...): a stream's step lower than its previous
one (or equal, for a side's perf line) starts a new segment (a restarted job appending to the log),
flagged `restart`; an evaluation may run twice at rollout 0 (before the first training and after it).

Run meta: framework `slime`, and where the log shows them (Megatron's argument listing
`  colocate ...... True` or the command line `--colocate`, `--actor-num-gpus-per-node 4`) whether
training and rollout share GPUs (`colocate`), the actor's GPUs (`actor_num_nodes`,
`actor_num_gpus_per_node`, `n_gpus`), the rollout's (`rollout_num_gpus`), `n_sampling`,
`rollout_batch_size`, `global_batch_size`, `max_response_len` and the model.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console import ConsoleGrammar, NoiseRules, ParsedMetrics
from polytrace_cli.ingest.console.pipeline import METRIC, check_steps, classify
from polytrace_cli.ingest.console.reading import read_console_lines
from polytrace_cli.ingest.console.records import account_other_lines, store_metrics
from polytrace_cli.ingest.formats.slime import names
from polytrace_cli.ingest.registry import is_binary, register

# The dict lines slime prints per rollout, by the word before the rollout id; each side prints its perf
# line once per rollout.
STREAMS = ("perf", "rollout", "eval", "multi_turn", "passrate")
ONCE_PER_ROLLOUT = frozenset({"perf", "perf-rollout"})
_LOG_PREFIX = r"(?:\[[^\]]*\]\s*\S+:\d+ - )?"
METRIC_LINE = rf"^{_LOG_PREFIX}(?:{'|'.join(STREAMS)}) -?\d+: \{{"
OPTIMIZER_STEP_LINE = rf"^{_LOG_PREFIX}(?:[a-z]+-)?step -?\d+: \{{'train/"
_METRIC = re.compile(rf"^{_LOG_PREFIX}({'|'.join(STREAMS)}) (\S+): (\{{.*\}})\s*$")
_SNIFF = re.compile(rb"(?m)(?:^|\) |\.py:\d+ - )perf \d+: \{'(?:perf|rollout)/")
_NUMPY_SCALAR = re.compile(r"\b(?:np|numpy)\.(?:float|int|uint)\d*\(([^()]*)\)")
_NUMPY_BOOL = re.compile(r"\b(?:np|numpy)\.(True|False)_")
_BARE_SPECIAL = re.compile(r"(?<=[:,\[(])(\s*)(-?)\b(nan|inf)\b")
_NAN_TEXT = "\x00nan"
_NUMBER_LITERAL = re.compile(r"(?<![\w.'\"])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")

SLIME_NOISE = NoiseRules(
    (("optimizer-step dict", OPTIMIZER_STEP_LINE),
     ("timer", r"^(?:\[[^\]]*\]\s*\S+:\d+ - )?Timer \S+ (?:start|end)"),
     *cl.NOISE_RULES),
    default="other", ray="ray-log")

# Settings in Megatron's argument listing (`  colocate ........ True`) or on the command line
# (`--actor-num-gpus-per-node 4`), and the run meta key each fills.
SETTINGS = {
    "colocate": "colocate",
    "actor_num_nodes": "actor_num_nodes",
    "actor_num_gpus_per_node": "actor_num_gpus_per_node",
    "rollout_num_gpus": "rollout_num_gpus",
    "rollout_num_gpus_per_engine": "rollout_num_gpus_per_engine",
    "n_samples_per_prompt": "n_sampling",
    "rollout_batch_size": "rollout_batch_size",
    "global_batch_size": "global_batch_size",
    "rollout_max_response_len": "max_response_len",
    "hf_checkpoint": "model",
}
_LISTED = re.compile(rf"^\s+({'|'.join(SETTINGS)}) \.+ (\S+)\s*$")
_FLAG = re.compile(rf"--({'|'.join(name.replace('_', '-') for name in SETTINGS)})(?:[ =](?!-)([^\s\\]+))?")
_SETTINGS_LINE = rf"^\s+(?:{'|'.join(SETTINGS)}) \.+ |--(?:{'|'.join(n.replace('_', '-') for n in SETTINGS)})\b"


class SlimeGrammar(ConsoleGrammar):
    """Cleaning and classifying slime's lines (the console pipeline's first steps); `load` parses."""

    anchor = "perf "
    noise = SLIME_NOISE

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        return pl.when(cleaned.str.contains(METRIC_LINE)).then(pl.lit(METRIC))


def _payload(text: str) -> dict:
    """The dict a printed repr stands for (numpy scalar reprs and bare nan/inf accepted)."""
    if "np." in text or "numpy." in text:
        text = _NUMPY_BOOL.sub(r"\1", _NUMPY_SCALAR.sub(r"\1", text))
    if "nan" in text or "inf" in text:
        text = _BARE_SPECIAL.sub(lambda m: m.group(1) + (repr(_NAN_TEXT) if m.group(3) == "nan"
                                                         else m.group(2) + "1e999"), text)
    value = ast.literal_eval(text)
    if not isinstance(value, dict):
        raise ValueError("not a dict")
    return value


def _pair(value) -> tuple[float | None, str | None]:
    if value == _NAN_TEXT:
        return math.nan, None
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, (int, float)):
        number = float(value)
        return number, None
    if value is None:
        return None, None
    if isinstance(value, str):
        return None, value
    return None, json.dumps(value, default=str)


def parse_lines(ctx: FileContext, lines: pl.DataFrame) -> tuple[ParsedMetrics, dict[int, str]]:
    """Pairs of the metric lines (`lines` classified), and each line's stream: the printed word, with
    the rollout side's perf lines (those holding `perf/rollout_time`) apart from the training side's."""
    rows: list[tuple] = []
    streams: dict[int, str] = {}
    for line_no, cleaned, raw in lines.filter(pl.col("kind") == METRIC).select("line_no", "c", "raw").iter_rows():
        match = _METRIC.match(cleaned)
        try:
            if match is None:
                raise ValueError("no closing brace")
            payload = _payload(match.group(3))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
            ctx.reject(line_no, f"slime metrics dict cannot be read: {error}", raw, code=ErrorCode.UNPARSABLE_LINE)
            continue
        if not payload:
            ctx.ignore("empty dict")
            continue
        huge = next((text for text in _NUMBER_LITERAL.findall(match.group(3)) if math.isinf(float(text))), None)
        if huge is not None:
            ctx.reject(line_no, f"slime metrics dict: {huge} is out of range for a double", raw, code=ErrorCode.OUT_OF_RANGE)
            continue
        stream = match.group(1)
        if stream == "perf" and "perf/rollout_time" in payload:
            stream = "perf-rollout"
        streams[line_no] = stream
        for index, (key, value) in enumerate(payload.items(), start=1):
            number, text = _pair(value)
            rows.append((line_no, match.group(2), index, str(key), number, text,
                         None if number is None else repr(value)))
    return ParsedMetrics.from_rows(rows), streams


def stream_segments(steps: list[tuple[int, int]], streams: dict[int, str]) -> pl.DataFrame:
    """Segments of the metric lines ((line_no, step) in line order): a line whose step is below the
    previous step of its own stream (or equal to it, for the perf lines each side prints once per
    rollout) starts a new segment, and every stream starts afresh there. An evaluation may run twice at
    one rollout id (before the first training and after it).
    Columns as `segments.line_segments` gives them (line_no, step, previous, resumed, segment)."""
    segment, last, rows = 0, {}, []
    for line_no, step in steps:
        stream = streams[line_no]
        previous = last.get(stream)
        if previous is not None and (step < previous or step == previous and stream in ONCE_PER_ROLLOUT):
            segment += 1
            last = {}
        last[stream] = step
        rows.append((line_no, step, previous, False, segment))
    return pl.DataFrame(rows, schema={"line_no": pl.Int64, "step": pl.Int64, "previous": pl.Int64,
                                      "resumed": pl.Boolean, "segment": pl.Int32}, orient="row")


def settings(texts: list[str]) -> dict:
    """Run meta from the settings the log shows (the last one printed wins); n_gpus = the actor's
    nodes × GPUs per node, plus the rollout's GPUs when they are not colocated."""
    found: dict = {}
    for text in texts:
        listed = _LISTED.match(text)
        pairs = [listed.groups()] if listed else [(name.replace("-", "_"), value) for name, value in _FLAG.findall(text)]
        for name, value in pairs:
            if name == "colocate":
                found["colocate"] = value in ("", "True", "true", "1") if listed else True
            elif value and value not in ("None",) and not value.startswith(("$", "-")):
                found[SETTINGS[name]] = int(value) if re.fullmatch(r"\d+", value) else value
    nodes, per_node = found.get("actor_num_nodes"), found.get("actor_num_gpus_per_node")
    if isinstance(nodes, int) and isinstance(per_node, int):
        rollout = found.get("rollout_num_gpus")
        found["n_gpus"] = nodes * per_node + (rollout if isinstance(rollout, int) and found.get("colocate") is False
                                              else 0)
    return found


@register
class SlimeConsoleIngester(Ingester):
    name = "slime-console"
    version = "1"
    framework = "slime"
    description = "slime / miles stdout: `perf N: {...}`, `rollout N: {...}`, `eval N: {...}` dicts per rollout"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return not is_binary(head) and _SNIFF.search(head) is not None

    def load(self, ctx: FileContext) -> None:
        grammar = SlimeGrammar()
        lines = classify(read_console_lines(ctx.path), grammar)
        ctx.lines = lines.height
        lines = account_other_lines(ctx, lines, pl.col("kind") != METRIC)
        parsed, streams = parse_lines(ctx, lines)
        parsed = check_steps(ctx, parsed, lines)
        metrics = parsed.metrics
        texts = lines.filter(pl.col("c").str.contains(_SETTINGS_LINE)).get_column("c").to_list()
        ctx.run_meta.update({"framework": "slime", **settings(texts)})
        if not metrics.height:
            ctx.note("zero steps: no slime metric lines")
            return
        steps = metrics.select("line_no", "step").unique("line_no", maintain_order=True)
        segments = stream_segments(list(steps.iter_rows()), streams)
        ctx.stored = segments.height
        store_metrics(ctx, metrics, segments, "slime", "a stream's rollout id went back", lines=lines)
