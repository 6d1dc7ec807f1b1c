"""SkyRL's console tracker (`trainer.logger=console`, its default): one pretty-printed dict per step.

`skyrl/train/utils/tracking.py` `ConsoleLogger.log` writes, through loguru:

    2025-08-21 18:02:38.123 | INFO     | skyrl.train.utils.tracking:log:189 - Step 3:
    {'generate/avg_num_tokens': 512.0,
     'timing/generate': '41.2500',
     'timing/step': '77.0310'}

`pprint.pformat` of the step's payload, every float first turned into text with four decimals
(`stringify_floats`): such texts are read back as numbers, with the precision they were printed at
(0.0001: the fewest decimals seen) in the run meta; ints stay ints. The dict runs over the lines after the `Step N:` line until its brackets
balance (and may sit behind a Ray prefix, removed by the console cleaning). The header and the
dict's lines are stored together; a dict that does not read (cut short, not a literal) rejects each
of its lines. A step not above the one before starts a new segment (a restarted job), flagged
`restart`. Every other line is counted under the console's noise rules. Run meta from the config
SkyRL logs at start: `colocate` (`placement.colocate_all`), the policy's nodes and GPUs per node
(`n_gpus` when colocated), `n_sampling`.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from polytrace_cli.errors import ErrorCode
from polytrace_cli.lazy import polars as pl

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest.base import FileContext, Ingester
from polytrace_cli.ingest.console import ConsoleGrammar, NoiseRules, ParsedMetrics
from polytrace_cli.ingest.console.pipeline import METRIC, check_steps, classify
from polytrace_cli.ingest.console.reading import read_console_lines
from polytrace_cli.ingest.console.records import account_other_lines, did_not_rise, step_segments, store_metrics
from polytrace_cli.ingest.formats.skyrl import names
from polytrace_cli.ingest.registry import is_binary, register

HEADER = r"(?:^|\| [\w.]+:\w+:\d+ - )Step (-?\d+): ?$"
_HEADER = re.compile(HEADER)
_SNIFF = re.compile(rb"\| INFO +\| [\w.]+:log:\d+ - Step \d+: ?\r?\n(?:\([^)]*pid=\d+[^)]*\) )?\{'")
_STRING_LITERAL = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
_PLACES = re.compile(r"^-?\d*\.(\d+)$")
_FLOAT_TEXT = re.compile(r"^-?(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?$|^-?(?:nan|inf)$")
MAX_DICT_LINES = 5000
DICT_CHUNK = 64

SKYRL_NOISE = NoiseRules(cl.NOISE_RULES, default="other", ray="ray-log")

# Settings of the config SkyRL logs at start (`main_base.py`: its YAML, `skyrl/train/config/config.py`
# field names), and the run meta key each fills; the first one printed wins.
SETTINGS = {"colocate_all": "colocate", "policy_num_nodes": "policy_num_nodes",
            "policy_num_gpus_per_node": "policy_num_gpus_per_node", "n_samples_per_prompt": "n_sampling"}
SETTING_LINE = rf"^\s*(?:{'|'.join(SETTINGS)}): \S+\s*$"
_SETTING = re.compile(rf"^\s*({'|'.join(SETTINGS)}): (\S+)\s*$")


def settings(texts: list[str]) -> dict:
    """Run meta from the config's lines: whether training and generation share GPUs (`colocate`), the
    policy's nodes and GPUs per node, `n_sampling`; `n_gpus` (the policy's) when colocated."""
    found: dict = {}
    for text in texts:
        if (match := _SETTING.match(text)) and SETTINGS[match.group(1)] not in found:
            value = match.group(2)
            found[SETTINGS[match.group(1)]] = (value == "true") if value in ("true", "false") else (
                int(value) if value.isdigit() else value)
    nodes, per_node = found.get("policy_num_nodes"), found.get("policy_num_gpus_per_node")
    if found.get("colocate") is True and isinstance(nodes, int) and isinstance(per_node, int):
        found["n_gpus"] = nodes * per_node
    return found


class SkyRLGrammar(ConsoleGrammar):
    """Cleaning and classifying SkyRL's lines (the console pipeline's first steps); `load` parses."""

    anchor = "{"
    noise = SKYRL_NOISE

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        return pl.when(cleaned.str.contains(HEADER)).then(pl.lit(METRIC))


def _value(value) -> tuple[float | None, str | None]:
    if isinstance(value, bool):
        return float(value), None
    if isinstance(value, (int, float)):
        return float(value), None
    if isinstance(value, str):
        return (float(value), None) if _FLOAT_TEXT.match(value) else (None, value)
    if value is None:
        return None, None
    return None, json.dumps(value, default=str)


def _flatten(payload: dict, prefix: str = "") -> list[tuple[str, object]]:
    items = []
    for key, value in payload.items():
        if isinstance(value, dict) and value:
            items += _flatten(value, f"{prefix}{key}/")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def parse_dicts(ctx: FileContext, lines: pl.DataFrame) -> tuple[ParsedMetrics, dict[int, list[int]], set[int]]:
    """Pairs of each `Step N:` dict, the lines each dict (header and body) spans by its header, and the
    headers whose dict could not be read (each of its lines rejected).
    The dict's lines are the cleaned lines after the header until the brackets outside string
    literals balance."""
    cleaned, numbers, raws = lines.get_column("c"), lines.get_column("line_no"), lines.get_column("raw")
    headers = lines.with_row_index("position").filter(pl.col("kind") == METRIC).select("position", "line_no", "c")
    rows: list[tuple] = []
    spanned: dict[int, list[int]] = {}
    unreadable: set[int] = set()
    decimals: set[int] = set()
    for start, line_no, header in headers.iter_rows():
        step = _HEADER.search(header).group(1)
        depth, body = 0, []
        # Only the lines after a header come to Python, a chunk at a time, until the dict closes.
        for offset in range(0, MAX_DICT_LINES, DICT_CHUNK):
            chunk = cleaned.slice(start + 1 + offset, DICT_CHUNK).to_list()
            for text in chunk:
                if not body and not text.lstrip().startswith("{") or body and _HEADER.search(text):
                    break  # no dict after the header, or the next step's header before this dict closed
                body.append(text)
                bare = _STRING_LITERAL.sub("", text)
                depth += sum(bare.count(c) for c in "{[(") - sum(bare.count(c) for c in "}])")
                if depth <= 0:
                    break
            if len(chunk) < DICT_CHUNK or not body or depth <= 0 or len(body) < offset + DICT_CHUNK:
                break
        block = numbers.slice(start, len(body) + 1).to_list()
        spanned[line_no] = block
        try:
            if not body or depth > 0:
                raise ValueError("the dict after it does not close" if body else "no dict after it")
            payload = ast.literal_eval("\n".join(body))
            if not isinstance(payload, dict):
                raise ValueError("not a dict")
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
            for number, raw in zip(block, raws.slice(start, len(block)).to_list()):
                ctx.reject(number, f"SkyRL step {step} dict cannot be read: {error}", raw, code=ErrorCode.UNPARSABLE_LINE)
            unreadable.add(line_no)
            continue
        for pair_index, (key, value) in enumerate(_flatten(payload), start=1):
            number, text = _value(value)
            rows.append((line_no, step, pair_index, key, number, text, None))
            if isinstance(value, str) and number is not None and (places := _PLACES.match(value)):
                decimals.add(len(places.group(1)))
    ctx.run_meta["value_precision"] = 10.0 ** -min(decimals) if decimals else None
    return ParsedMetrics.from_rows(rows), spanned, unreadable


@register
class SkyRLConsoleIngester(Ingester):
    name = "skyrl-console"
    version = "1"
    framework = "skyrl"
    description = "SkyRL console tracker: `Step N:` and the step's metrics dict pretty-printed by loguru"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return not is_binary(head) and _SNIFF.search(head) is not None

    def load(self, ctx: FileContext) -> None:
        lines = classify(read_console_lines(ctx.path), SkyRLGrammar())
        ctx.lines = lines.height
        parsed, spanned, unreadable = parse_dicts(ctx, lines)
        taken = sorted(number for block in spanned.values() for number in block)
        in_dict = pl.col("line_no").is_in(pl.Series(taken, dtype=pl.Int64).implode())
        rest = lines.filter(~in_dict)
        if "encoding" in rest.columns:
            damaged = pl.col("encoding").is_not_null()
            for line_no, reason, raw in rest.filter(damaged).select("line_no", "encoding", "raw").iter_rows():
                ctx.reject(line_no, reason, raw, code=ErrorCode.ENCODING_ERROR)
            rest = rest.filter(~damaged)
        for rule, count in rest.group_by("kind").len().sort("kind").iter_rows():
            ctx.ignore(rule, count)
        metrics = check_steps(ctx, parsed, lines).metrics
        texts = rest.filter(pl.col("c").str.contains(SETTING_LINE)).get_column("c").to_list()
        ctx.run_meta.update({"framework": "skyrl", **settings(texts)})
        stored = set(metrics.get_column("line_no").unique().to_list())
        read = set(parsed.metrics.get_column("line_no").unique().to_list())
        for header, block in spanned.items():
            if header in stored:
                ctx.stored += len(block)
            elif header in read:  # its step was rejected with the header line (`check_steps`)
                ctx.ignore("dict of a rejected step line", len(block) - 1)
            elif header not in unreadable:
                ctx.ignore("empty step dict", len(block))
        if not metrics.height:
            ctx.note("zero steps: no SkyRL step dicts")
            return
        segments = step_segments(list(metrics.select("line_no", "step").unique("line_no", maintain_order=True)
                                      .iter_rows()), did_not_rise)
        store_metrics(ctx, metrics, segments, "skyrl", lines=lines)
