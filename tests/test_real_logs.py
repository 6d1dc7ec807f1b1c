"""Every real log of ../shared/data/real read exactly: its step numbers, step count and values,
each checked against a reading written here that does not use polytrace's parsers (a regex, `ast`,
`json`), on the rules of the framework that wrote the file:

- verl prints `step:N - key:value - ...` per step (`verl/utils/tracking.py` ConsoleLogger; values
  `{v:.3f}` up to 0.4, `repr` of numpy scalars from 0.5); wandb's `output.log` cuts lines at 4,096
  characters.
- The transformers Trainer logs a dict when global_step % logging_steps == 0
  (huggingface/transformers@55093b758b338fdc7903e778509523d755ae080d
  src/transformers/trainer_callback.py, DefaultFlowCallback.on_step_end), each value the mean over
  the steps since the last log (huggingface/trl@f2cd57710ae345ea6428ae95363267fcf38a3dc8
  trl/trainer/grpo_trainer.py, `training_step` appends one `step_time` per optimizer step and
  `log` averages the lists), so the k-th dict of a run is step k × logging_steps.

The folder is skipped when absent. Each file's run is read once per module.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest

from conftest import SHARED_DATA
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store

REAL = SHARED_DATA / "real"
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
RAY = re.compile(r"^\s*(?:\([\w.\-]+ pid=\d+(?:, ip=[\d.]+)?\)\s*)+")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """(store, {folder: [FileReport]}) with every folder of the real data read, each as its own run."""
    if not REAL.exists():
        pytest.skip(f"real data not present: {REAL}")
    con = open_store(tmp_path_factory.mktemp("real") / "real.duckdb")
    reports = {folder.name: ingest_paths(con, [folder], run_name=folder.name)
               for folder in sorted(REAL.iterdir()) if folder.is_dir()}
    yield con, reports
    con.close()


def stored(con, run: str, keys: set[str] | None = None) -> dict[tuple[int, str], float]:
    rows = con.execute("SELECT step, key, value FROM step_metrics JOIN runs USING (run_id) WHERE name = ? "
                       "AND value IS NOT NULL", [run]).fetchall()
    return {(step, key): value for step, key, value in rows if keys is None or key in keys}


def steps_of(con, run: str) -> list[int]:
    return [step for (step,) in con.execute(
        "SELECT DISTINCT step FROM step_metrics JOIN runs USING (run_id) WHERE name = ? ORDER BY step", [run]).fetchall()]


def plain_lines(path: Path) -> list[str]:
    """The file's lines (split on newlines only), each without ANSI codes, its carriage-return
    redraws before the last piece, and the Ray prefix."""
    out = []
    for line in path.read_bytes().decode("utf-8", "replace").split("\n"):
        line = ANSI.sub("", line).rstrip("\r").split("\r")[-1]
        out.append(RAY.sub("", line))
    return out


def verl_reading(path: Path) -> dict[tuple[int, str], float]:
    """(step, key) -> value of every numeric pair of every `step:N - ...` line; a line at wandb's
    4,096-character cut loses its last, cut pair."""
    pairs: dict[tuple[int, str], float] = {}
    raw_lines = path.read_bytes().decode("utf-8", "replace").split("\n")
    for raw, line in zip(raw_lines, plain_lines(path)):
        found = re.match(r"step:(\d+) - (.*)$", line)
        if not found:
            continue
        pieces = found.group(2).split(" - ")
        if len(raw.rstrip("\r")) == 4096:
            pieces = pieces[:-1]
        for piece in pieces:
            key, _, text = piece.partition(":")
            text = re.sub(r"^np\.float\d+\((.*)\)$", r"\1", text.strip())
            try:
                pairs[(int(found.group(1)), key.strip())] = float(text)
            except ValueError:
                continue
    return pairs


def same(ours: dict, theirs: dict) -> list:
    """The (step, key) whose values differ (nan equal to nan) or that one side lacks."""
    differ = [k for k in theirs if k not in ours or not (ours[k] == theirs[k] or (
        math.isnan(ours[k]) and math.isnan(theirs[k])))]
    return differ + [k for k in ours if k not in theirs]


@pytest.mark.parametrize("folder, first, last, count", [
    ("verl03-ppo-gsm8k-raysubmit", 101, 435, 335),
    ("verl05dev-agentloop-opd-wandb", 0, 261, 262),
    ("verl06-multiturn-gui-agent", 1, 2, 2),
])
def test_verl_console_logs_read_as_printed(real, folder, first, last, count):
    con, reports = real
    (log,) = [r for r in reports[folder] if r.format == "verl-console"]
    assert log.rejected == 0 and log.unread_records == 0
    theirs = verl_reading(Path(log.path))
    assert sorted({step for step, _ in theirs}) == steps_of(con, folder)
    steps = steps_of(con, folder)
    assert (steps[0], steps[-1], len(steps)) == (first, last, count)
    ours = stored(con, folder, {key for _, key in theirs})
    assert same(ours, theirs) == []


def test_verl_without_metric_lines_reads_the_progress_bar(real):
    con, reports = real
    (log,) = reports["verl04-grpo-tqdm-only"]
    bars = {}
    for line in plain_lines(Path(log.path)):
        for count, minutes, seconds in re.findall(r"Training Progress:.*?\|\s*(\d+)/\d+ \[(\d+):(\d+)<", line):
            bars[int(count)] = int(minutes) * 60 + int(seconds)  # the last draw of a count
    bars.pop(0, None)  # the bar drawn before the first step
    assert steps_of(con, "verl04-grpo-tqdm-only") == sorted(bars) == list(range(1, 34))
    assert stored(con, "verl04-grpo-tqdm-only", {"tqdm/elapsed_s"}) == {
        (step, "tqdm/elapsed_s"): float(elapsed) for step, elapsed in bars.items()}


def test_a_run_that_died_before_its_first_step(real):
    con, reports = real
    (log,) = reports["searchr1-verl-ppo-oom-crash"]
    lines = plain_lines(Path(log.path))
    assert not any(re.match(r"step:\d+ - ", line) for line in lines)
    oom = [line.strip() for line in lines if line.strip().startswith("torch.cuda.OutOfMemoryError")]
    assert steps_of(con, "searchr1-verl-ppo-oom-crash") == []
    crash = con.execute("SELECT crash FROM run_semantics JOIN runs USING (run_id) WHERE name = ?",
                        ["searchr1-verl-ppo-oom-crash"]).fetchall()[0][0]
    assert crash == oom[0][:160]
    assert log.notes == [f"zero steps: the log ends before step 1; the job died before its first step: {oom[0][:160]}"]


def trainer_dicts(path: Path) -> list[dict]:
    """The Trainer's dicts of a console log, in order, read with `ast` from the text from `{'` on."""
    found = []
    for line in path.read_bytes().decode("utf-8", "replace").split("\n"):
        for piece in ANSI.sub("", line).split("\r"):
            start = piece.find("{'")
            if start < 0:
                continue
            try:
                payload = ast.literal_eval(piece[start:].strip())
            except (ValueError, SyntaxError):
                continue
            if isinstance(payload, dict) and ("epoch" in payload or "loss" in payload):
                found.append(payload)
    return found


def bar_counts(path: Path, total: int) -> list[int]:
    return [int(n) for n in re.findall(rf"\|\s*(\d+)/{total} \[", path.read_bytes().decode("utf-8", "replace"))]


@pytest.mark.parametrize("folder, name, total, rl_key", [
    ("trl-new-grpo-7b-steptime-collapse", "rho1.00_seed42.log", 200, "completions/mean_length"),
    ("trl-unsloth-sft-then-grpo-tsc-killed", ".docker_run.log", 1404, "completions/mean_length"),
])
def test_trl_console_dicts_are_numbered_k_times_logging_steps(real, folder, name, total, rl_key):
    """Neither log prints its training arguments: logging_steps is the training bar's last count
    over the RL dicts logged (⌊200 / 40⌋ = 5, ⌊347 / 69⌋ = 5); the k-th RL dict is step 5k,
    whatever count the bar showed when the dict was printed."""
    con, reports = real
    (log,) = reports[folder]
    assert Path(log.path).name == name and log.format == "trl-console"  # a hidden file named as a log is read
    assert log.rejected == 0 and log.unread_records == 0
    rl = [d for d in trainer_dicts(Path(log.path)) if rl_key in d]
    interval = max(bar_counts(Path(log.path), total)) // len(rl)
    assert interval == 5
    theirs: dict[tuple[int, str], float] = {}
    for k, entry in enumerate(rl, start=1):
        for key, value in entry.items():
            key = "unsloth/completion_length" if key == "completion_length" and rl_key in entry else key
            if isinstance(value, (int, float)):
                theirs[(k * interval, key)] = float(value)
    assert steps_of(con, folder) == [k * interval for k in range(1, len(rl) + 1)]
    assert con.execute("SELECT count(DISTINCT segment) FROM step_metrics JOIN runs USING (run_id) WHERE name = ?",
                       [folder]).fetchall() == [(1,)]
    assert same(stored(con, folder, {key for _, key in theirs}), theirs) == []
    # Each row stands for the 5 steps it averages; the mean length is TRL's, not Unsloth's.
    assert set(stored(con, folder, {"trl/steps_covered"}).values()) == {5.0}
    means = dict(con.execute("SELECT step, response_length_mean FROM steps JOIN runs USING (run_id) WHERE name = ?",
                             [folder]).fetchall())
    assert means == {k * interval: entry[rl_key] for k, entry in enumerate(rl, start=1)}
    # Both print a total train batch size of 8 before their GRPO stage (transformers' and Unsloth's
    # banners): the completions of a step.
    assert con.execute("SELECT responses_per_step FROM run_semantics JOIN runs USING (run_id) WHERE name = ?",
                       [folder]).fetchall() == [(8.0,)]


def test_the_sft_stage_before_grpo_is_kept_apart(real):
    con, reports = real
    (log,) = reports["trl-unsloth-sft-then-grpo-tsc-killed"]
    dicts = trainer_dicts(Path(log.path))
    sft = [d for d in dicts if "completions/mean_length" not in d and "train_runtime" not in d]
    assert len(sft) == 40
    ignored = dict(con.execute("SELECT rule, lines FROM ignored_lines WHERE file_id = (SELECT file_id FROM files "
                               "WHERE path = ?)", [log.path]).fetchall())
    assert ignored["SFT stage dict"] == 40
    meta = json.loads(con.execute("SELECT meta FROM runs WHERE name = ?", [log.run]).fetchall()[0][0])
    assert meta["trl_sft_stage"] == {"dicts": 40, "last_loss": sft[-1]["loss"]}
    assert (meta["trl_last_step"], meta["trl_max_steps"]) == (345, 1404)


def test_trainer_state_log_history_read_as_written(real):
    con, reports = real
    (state,) = reports["trl014-unsloth-grpo-gsm8k-trainerstate"]
    history = json.loads(Path(state.path).read_text())["log_history"]
    theirs = {(entry["step"], key): float(value) for entry in history if "train_runtime" not in entry
              for key, value in entry.items() if key != "step" and isinstance(value, (int, float))}
    assert steps_of(con, "trl014-unsloth-grpo-gsm8k-trainerstate") == list(range(1, 251))
    assert same(stored(con, "trl014-unsloth-grpo-gsm8k-trainerstate", {k for _, k in theirs}), theirs) == []
