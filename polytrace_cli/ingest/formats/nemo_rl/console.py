"""NeMo-RL's console log: the GRPO loop's stdout, a block of bullets per step.

What `nemo_rl/algorithms/grpo.py` prints (synchronous and asynchronous GRPO):

    ========================= Epoch 1/1 =========================
    ========================= Step 3/100 =========================
    📊 Training Results:
      • Loss: 0.0123
      • Avg Reward: 0.4200
      • Mean Generation Length: 612.3400
    ⏱️  Timing:
      • Total step time: 45.12s
      • generation: 20.11s (44.6%)
    📊 Validation Results:            (when the step validates; before step 1 for the initial one)
        • Accuracy: 0.5000
    ⏱️  Validation Timing:
        • Total validation time: 12.30s

Each bullet of those four blocks is stored under the key its metric is logged with to TensorBoard or
W&B (`timing/train/generation`, `loss`, `reward`, `mean_gen_tokens_per_sample`, `validation/accuracy`,
`timing/validation/total_validation_time`), so that the console and the trackers of one run share
their names (`names.py`). The timers are printed with two decimals: the precision (0.01 s) is in the
run meta. Other bullets (the performance metrics, the token imbalance per worker) are ignored under
`other bullet`.

The step is the `Step N/M` header's N. The synchronous loop counts it within the epoch (it starts at 1
again with each `Epoch` header, where the trackers' step counts on): a step printed after an epoch
header goes on from the last step of the epochs before. A step lower than the one before starts a new
segment (a restarted job appending to the log), flagged `restart`.
Bullets before the first header (the initial validation) belong to step 0.

Run meta: framework `nemo_rl`, value precision, and from the `Final config:` pprint the cluster
(`num_nodes`, `gpus_per_node`, `n_gpus`), `n_sampling` (`num_generations_per_prompt`),
`num_prompts_per_step`, the model, whether generation is colocated with training, and whether the
loop is asynchronous (`async_grpo`).
"""

from __future__ import annotations

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
from polytrace_cli.ingest.console.records import account_other_lines, went_back, step_segments, store_metrics
from polytrace_cli.ingest.formats.nemo_rl import names
from polytrace_cli.ingest.registry import is_binary, register

STEP_HEADER = re.compile(r"^=+ Step (\S+)/\S+ =+\s*$")
EPOCH_HEADER = re.compile(r"^=+ Epoch (\d+)/\d+ =+\s*$")
BULLET = re.compile(r"^\s*•\s*([^:]+):\s*(.*?)\s*$")
# The blocks whose bullets are read, by their title, and the key prefix of their bullets.
BLOCKS = {"Training Results:": "", "Timing:": "timing/train/", "Validation Results:": "validation/",
          "Validation Timing:": "timing/validation/"}
_TITLE = re.compile(r"^\s*(?:📊|⏱️?)\s*(" + "|".join(re.escape(title) for title in BLOCKS) + r")\s*$")
# Bullet labels and the key each is logged with (`grpo.py` prints `metrics[...]` under these labels).
LABELS = {
    "Loss": "loss", "Draft Loss": "draft_loss", "Generation KL Error": "gen_kl_error", "Avg Reward": "reward",
    "Avg Filtered Reward": "filtered_reward", "Avg Total Reward": "reward",
    "Mean Generation Length": "mean_gen_tokens_per_sample", "Total step time": "total_step_time",
    "Accuracy": "accuracy", "Average response length": "avg_length", "Samples processed": "num_samples",
    "Total validation time": "total_validation_time",
}
_VALUE = re.compile(r"^(-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|nan|inf|-inf)(?:s\b.*| tokens)?$")
# Headers, bullets, and block titles (an emoji, then words and a colon): a title not in BLOCKS ends
# the block before it.
METRIC_LINE = r"^=+ (?:Step|Epoch) \S+/\S+ =+\s*$|^\s*•|^\s*[^\x00-\x7F]+\s+[A-Z][\w ]*:\s*$"
_ANY_TITLE = re.compile(r"^\s*[^\x00-\x7F]+\s+[A-Z][\w ]*:\s*$")
# A header at a line's start, or after the time it is printed with (`kubectl logs --timestamps`).
_SNIFF = re.compile(r"(?m)^(?:\[?\d{4}-\d{2}-\d{2}[ T][\d:.,]+(?:Z|[+-][\d:]+)?\]?\s+)?=+ Step \d+/\d+ =+\s*$".encode())
_SNIFF_BLOCK = re.compile("⏱️  Timing:|📊 Training Results:".encode())

NEMO_NOISE = NoiseRules(cl.NOISE_RULES, default="other", ray="ray-log")

_CONFIG_INT = re.compile(r"'(num_nodes|gpus_per_node|num_generations_per_prompt|num_prompts_per_step)': (\d+)")
_MODEL = re.compile(r"'model_name': '([^']+)'")
_COLOCATED = re.compile(r"'colocated': \{'enabled': (True|False)")
_ASYNC = re.compile(r"'async_grpo': \{'enabled': (True|False)")


class NemoRlGrammar(ConsoleGrammar):
    """Cleaning and classifying NeMo-RL's lines (the console pipeline's first steps); `load` parses."""

    anchor = "="
    noise = NEMO_NOISE

    def metric_kind(self, cleaned: pl.Expr, raw_chars: pl.Expr) -> pl.Expr:
        return pl.when(cleaned.str.contains(METRIC_LINE)).then(pl.lit(METRIC))


def parse_lines(ctx: FileContext, lines: pl.DataFrame) -> ParsedMetrics:
    """Pairs of the bullets of the four blocks, each at the step of the header above it (counted on
    over epochs). Headers, titles and other bullets are ignored under named rules."""
    rows: list[tuple] = []
    step, offset, last_step, prefix, new_epoch = "0", 0, 0, None, False
    for line_no, cleaned, raw in lines.filter(pl.col("kind") == METRIC).select("line_no", "c", "raw").iter_rows():
        if header := STEP_HEADER.match(cleaned):
            printed = header.group(1)
            if new_epoch and printed.isdigit():
                offset, new_epoch = last_step, False
            step = str(int(printed) + offset) if printed.isdigit() else printed
            last_step = int(step) if printed.isdigit() else last_step
            prefix = None
            ctx.ignore("step header")
            continue
        if epoch := EPOCH_HEADER.match(cleaned):
            new_epoch = int(epoch.group(1)) > 1
            if not new_epoch:
                offset = 0
            ctx.ignore("step header")
            continue
        if title := _TITLE.match(cleaned):
            prefix = BLOCKS[title.group(1)]
            ctx.ignore("block title")
            continue
        if _ANY_TITLE.match(cleaned):
            prefix = None
            ctx.ignore("block title")
            continue
        bullet = BULLET.match(cleaned)
        label = bullet.group(1).strip() if bullet else None
        if bullet is None or prefix is None or (prefix != "timing/train/" and label not in LABELS):
            ctx.ignore("other bullet")
            continue
        value = _VALUE.match(bullet.group(2))
        if value is None:
            ctx.reject(line_no, f"NeMo-RL bullet {label!r} holds no number: {bullet.group(2)[:60]!r}", raw,
                       code=ErrorCode.UNPARSABLE_LINE)
            continue
        key = prefix + LABELS.get(label, label)
        number = float(value.group(1))
        if math.isinf(number) and "inf" not in value.group(1):
            ctx.reject(line_no, f"NeMo-RL bullet {label!r}: {value.group(1)} is out of range for a double", raw,
                       code=ErrorCode.OUT_OF_RANGE)
            continue
        rows.append((line_no, step, 1, key, number, None, value.group(1)))
    return ParsedMetrics.from_rows(rows)


def config_meta(texts: list[str]) -> dict:
    """Run meta from the lines of the printed config (see the module docstring)."""
    found: dict = {}
    for text in texts:
        for key, value in _CONFIG_INT.findall(text):
            found.setdefault(key, int(value))
        for pattern, key in ((_MODEL, "model"), (_COLOCATED, "colocated"), (_ASYNC, "async_grpo")):
            if (match := pattern.search(text)) and key not in found:
                found[key] = match.group(1) == "True" if key != "model" else match.group(1)
    meta = {key: found[key] for key in ("model", "colocated", "async_grpo", "num_nodes", "gpus_per_node",
                                        "num_prompts_per_step") if key in found}
    if "num_generations_per_prompt" in found:
        meta["n_sampling"] = found["num_generations_per_prompt"]
    if "num_nodes" in found and "gpus_per_node" in found:
        meta["n_gpus"] = found["num_nodes"] * found["gpus_per_node"]
    return meta


@register
class NemoRlConsoleIngester(Ingester):
    name = "nemo-rl-console"
    version = "1"
    framework = "nemo_rl"
    description = "NeMo-RL GRPO stdout: `Step N/M` headers, Training Results and Timing bullets per step"
    metric_aliases = names.METRIC_ALIASES
    validation_prefixes = names.VALIDATION_PREFIXES

    def sniff(self, path: Path, head: bytes) -> bool:
        return not is_binary(head) and _SNIFF.search(head) is not None and _SNIFF_BLOCK.search(head) is not None

    def load(self, ctx: FileContext) -> None:
        lines = classify(read_console_lines(ctx.path), NemoRlGrammar())
        ctx.lines = lines.height
        lines = account_other_lines(ctx, lines, pl.col("kind") != METRIC)
        parsed = parse_lines(ctx, lines)
        metrics = check_steps(ctx, parsed, lines).metrics
        config_start = lines.filter(pl.col("c").str.starts_with("Final config:")).get_column("line_no")
        config = lines.filter(pl.col("line_no") > config_start.min()).head(2000) if config_start.len() else lines.clear()
        ctx.run_meta.update({"framework": "nemo_rl", "value_precision": 0.01, **config_meta(config.get_column("c").to_list())})
        if not metrics.height:
            ctx.note("zero steps: no NeMo-RL step summaries")
            return
        segments = step_segments(list(metrics.select("line_no", "step").iter_rows()), went_back)
        ctx.stored = segments.height
        store_metrics(ctx, metrics, segments, "nemo", lines=lines)
