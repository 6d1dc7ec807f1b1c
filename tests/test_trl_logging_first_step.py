"""TRL console logs of runs with `logging_first_step=True`: the Trainer logs a dict at step 1 besides
every `logging_steps`-th step, so the k-th dict is step 1, then L, 2L, ...

transformers' DefaultFlowCallback.on_step_end (huggingface/transformers@55093b758b338fdc7903e778509523d755ae080d,
src/transformers/trainer_callback.py):

    if state.global_step == 1 and args.logging_first_step:
        control.should_log = True
    if args.logging_strategy == IntervalStrategy.STEPS and state.global_step % state.logging_steps == 0:
        control.should_log = True

and ProgressCallback.on_log (same file) prints each dict with `round(logs["epoch"], 2)` above the bar
(`self.training_bar.write(str(shallow_logs))`). The field is `logging_first_step: bool` of
TrainingArguments (src/transformers/training_args.py), printed in its repr as `logging_first_step=True`.

Every log here is generated with known truth: per-step seconds and tokens, so that the steps, the
seconds each row stands for (`steps_covered`), the run's seconds and the tokens per step can be
checked against numbers computed by hand from the generator.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest.driver import ingest_paths


def step_seconds(step: int) -> float:
    return 2.0 + (step % 4) * 0.25  # binary fractions: sums and means are exact


def step_tokens(step: int) -> int:
    return 1000 + 8 * step


def logged_steps(total: int, interval: int, first: bool) -> list[int]:
    return ([1] if first and interval > 1 else []) + list(range(interval, total + 1, interval))


def write_log(path: Path, *, total: int = 50, interval: int = 10, first: bool = True, args: str | None = "both",
              bar: str = "each", steps_per_epoch: int = 50, summary: bool = True, tokens: bool = True) -> list[int]:
    """A GRPO console log as the Trainer prints it: the bar redrawn with carriage returns for every
    step, each logged dict (means over the steps since the last log) after the bar's draw of its step.
    `args`: which training arguments are printed ('both', 'logging_steps', or None); `bar`: 'each'
    (drawn every step) or 'none'; `tokens`: whether the dicts hold `num_tokens`. Returns the logged steps."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["Unsloth: Will patch GRPOTrainer", "==((====))==  Unsloth 2025.6.8: Fast Qwen2 patching."]
    if args == "both":
        lines.append(f"GRPOConfig(output_dir='out', logging_first_step={first}, logging_steps={interval}, "
                     f"max_steps={total})")
    elif args == "logging_steps":
        lines.append(f"GRPOConfig(output_dir='out', logging_steps={interval}, max_steps={total})")
    steps = logged_steps(total, interval, first)
    pending = f"  0%|          | 0/{total} [00:00<?, ?it/s]" if bar == "each" else ""
    elapsed, counted, since = 0.0, 0, 0
    for step in range(1, total + 1):
        elapsed += step_seconds(step)
        counted += step_tokens(step)
        if bar == "each":
            minutes, seconds = divmod(int(elapsed), 60)
            pending += f"\r{100 * step // total:3d}%|█         | {step}/{total} [{minutes:02d}:{seconds:02d}<00:10, 2.50s/it]"
        if step in steps:
            covered = range(since + 1, step + 1)
            metrics = {"loss": 0.001 * step, "grad_norm": 0.5, "learning_rate": 1e-06, "num_tokens": float(counted),
                       "completions/mean_length": 100.0 + step, "reward": 0.5, "kl": 0.002,
                       "step_time": sum(step_seconds(s) for s in covered) / len(covered),
                       "epoch": round(step / steps_per_epoch, 2)}
            if not tokens:
                del metrics["num_tokens"]
            lines.append(f"{pending}\r{' ' * 40}\r{metrics!r}" if pending else repr(metrics))
            pending, since = "", step
    if pending:
        lines.append(pending)
    if summary:
        lines.append(repr({"train_runtime": elapsed, "train_samples_per_second": 3.2,
                           "train_steps_per_second": round(total / elapsed, 3), "train_loss": 0.01,
                           "epoch": round(total / steps_per_epoch, 2)}))
    path.write_text("\n".join(lines) + "\n")
    return steps


def expected_rows(steps: list[int]) -> list[tuple]:
    """(step, steps_covered, step_s, total_tokens) of each logged step, from the generator's truth."""
    rows, since, cumulative = [], 0, {0: 0}
    for step in range(1, steps[-1] + 1):
        cumulative[step] = cumulative[step - 1] + step_tokens(step)
    for step in steps:
        covered = step - since
        seconds = sum(step_seconds(s) for s in range(since + 1, step + 1)) / covered
        rows.append((step, float(covered), seconds, (cumulative[step] - cumulative[since]) / covered))
        since = step
    return rows


COVERED = ("(SELECT coalesce(max(value), 1) FROM step_metrics m WHERE m.step = s.step"
           " AND m.key = 'trl/steps_covered')")


def stored_rows(con) -> list[tuple]:
    return con.execute(f"SELECT step, {COVERED}, step_s, total_tokens FROM steps s ORDER BY step").fetchall()


def run_meta(con) -> dict:
    return json.loads(con.execute("SELECT meta FROM runs").fetchall()[0][0])


def check_run(con, report, steps: list[int]) -> None:
    assert report.format == "trl-console" and report.rejected == 0
    assert report.lines == report.stored + report.ignored
    assert report.stored == len(steps)
    stored, expected = stored_rows(con), expected_rows(steps)
    assert [row[0] for row in stored] == [row[0] for row in expected]
    assert [v for row in stored for v in row] == pytest.approx([v for row in expected for v in row])
    # The run's seconds, Σ step_s × steps_covered, are the seconds of every step up to the last logged.
    [(seconds,)] = con.execute(f"SELECT sum(step_s * {COVERED}) FROM steps s").fetchall()
    assert seconds == pytest.approx(sum(step_seconds(s) for s in range(1, steps[-1] + 1)))
    assert con.execute("SELECT count(*) FROM step_flags").fetchall() == [(0,)]


def test_printed_logging_first_step_numbers_step_1_then_every_l(store, tmp_path):
    log = tmp_path / "grpo" / "train.log"
    steps = write_log(log)
    assert steps == [1, 10, 20, 30, 40, 50]
    [report] = ingest_paths(store, [log])
    check_run(store, report, steps)
    # By hand: step 1 stands for 1 step, step 10 for the 9 steps 2..10, the others for 10.
    assert [row[:2] for row in stored_rows(store)] == [(1, 1.0), (10, 9.0), (20, 10.0), (30, 10.0), (40, 10.0),
                                                        (50, 10.0)]
    meta = run_meta(store)
    assert (meta["trl_logging_steps"], meta["trl_logging_steps_source"], meta["trl_logging_first_step"]) == (
        10, "printed", True)
    assert "TRL dicts numbered k × logging_steps: logging_steps=10 as printed, and step 1 first " \
           "(logging_first_step)" in report.notes


@pytest.mark.parametrize("args", [None, "logging_steps"])
def test_first_step_inferred_from_the_bar_when_not_printed(store, tmp_path, args):
    """The bar's counter drawn before each dict reads 1, 10, 20, ...: the first step and every 10th. The
    log stops before its end (no end-of-training dict: the dict count cannot tell) and every epoch
    prints as 0.0 (10,000 steps an epoch: the epochs cannot tell)."""
    log = tmp_path / "grpo" / "train.log"
    steps = write_log(log, args=args, steps_per_epoch=10_000, summary=False)
    [report] = ingest_paths(store, [log])
    check_run(store, report, steps)
    assert run_meta(store)["trl_logging_first_step"] is True


def test_first_step_inferred_from_the_epochs_without_arguments_or_bar(store, tmp_path):
    """No argument printed and no bar: the interval comes from the end-of-training dict's steps
    (train_runtime × train_steps_per_second = 50 over 6 dicts, one of them step 1), the first step from
    the epochs: 0.02, 0.2, 0.4, 0.6, ... grow by 0.2 a dict from the second on, as they do only when
    the second dict is step L."""
    log = tmp_path / "grpo" / "train.log"
    steps = write_log(log, args=None, bar="none")
    [report] = ingest_paths(store, [log])
    check_run(store, report, steps)
    meta = run_meta(store)
    assert (meta["trl_logging_steps"], meta["trl_logging_steps_source"], meta["trl_logging_first_step"]) == (
        10, "end-of-training dict", True)


def test_first_step_inferred_from_the_dict_count(store, tmp_path):
    """logging_steps=10 printed, logging_first_step not, epochs all 0.0 (10,000 steps an epoch), no bar
    drawn before the dicts: the finished run's 50 steps (train_runtime × train_steps_per_second) over
    6 dicts = 50 / 10 + 1."""
    log = tmp_path / "grpo" / "train.log"
    steps = write_log(log, args="logging_steps", bar="none", steps_per_epoch=10_000)
    [report] = ingest_paths(store, [log])
    check_run(store, report, steps)
    assert run_meta(store)["trl_logging_first_step"] is True


@pytest.mark.parametrize("args,bar", [("both", "each"), (None, "each"), (None, "none"), ("logging_steps", "none")])
def test_without_logging_first_step_the_k_th_dict_is_step_k_l(store, tmp_path, args, bar):
    log = tmp_path / "grpo" / "train.log"
    steps = write_log(log, first=False, args=args, bar=bar)
    assert steps == [10, 20, 30, 40, 50]
    [report] = ingest_paths(store, [log])
    check_run(store, report, steps)
    assert run_meta(store)["trl_logging_first_step"] is False


def test_printed_false_wins_over_the_epochs(store, tmp_path):
    """`logging_first_step=False` printed: the dicts are read as every L-th even where a first-step
    reading would fit (here it does not: the log has no step-1 dict)."""
    log = tmp_path / "grpo" / "train.log"
    steps = write_log(log, first=False, args="both", bar="none")
    [report] = ingest_paths(store, [log])
    check_run(store, report, steps)


def test_a_grown_log_with_the_first_step_ends_as_one_ingest(tmp_path):
    """Read after its step-20 dict, then grown to its end: appended, with the rows of one ingest."""
    from test_incremental_ingest import grown_once

    log = tmp_path / "written" / "train.log"
    write_log(log, args=None)
    text = log.read_bytes()
    cut = text.index(b"'epoch': 0.4")
    cut = text.index(b"\n", cut) + 1
    status, rows, once = grown_once(tmp_path, text[:cut], text)
    assert status == "appended"
    assert rows == once


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["{'loss': 1.0, 'epoch': 0.5}", "{'loss': 2}", " 40%|###  | 4/10 [00:01<00:02]",
                                 "", "  ", "\x1b[0m{'loss': 3}", "{'a': 1} [repeated 2x across cluster]",
                                 "(A pid=1) {'b': 2}", "{'c': '\x1b[1m'}", "x"]),
                min_size=2, max_size=5).map("\r".join))
def test_cleaning_a_redrawn_line_agrees_with_python(line):
    """Lines of bar redraws whose last piece is a dict take the shortcut; the result must not change."""
    assert cl.clean_lines(pl.Series("raw", [line, line + "\r"]), "{'").to_list() == [
        cl.clean_line(line, "{'"), cl.clean_line(line + "\r", "{'")]


def test_a_log_read_after_its_step_1_dict_alone_is_read_whole_once_grown(tmp_path):
    """Read when it held only the step-1 dict (every step, as far as that read could tell: the bar read 1),
    then grown: the new dicts at 10, 20, ... make it a run logging its first step, which the stored
    numbering cannot follow, so the grown log is read whole and ends as one ingest, its dicts steps 1,
    10, ..., 50. The dicts hold no `num_tokens`: a stage whose only token count was read before cannot
    go on either (`_with_tokens_before`), so with it this log would be read whole whatever the rule of
    the one dict read before (`_interval`: the carried numbering, interval 1 from the bar, would
    number the grown dicts 2, 3, ... when appended)."""
    from test_incremental_ingest import grown_once

    log = tmp_path / "written" / "train.log"
    write_log(log, args=None, summary=False, tokens=False)
    text = log.read_bytes()
    assert b"num_tokens" not in text
    cut = text.index(b"\n", text.index(b"'epoch': 0.02")) + 1
    status, rows, once = grown_once(tmp_path, text[:cut], text)
    assert status == "replaced"
    assert rows == once
    con = duckdb.connect(str(tmp_path / "grown.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT step FROM steps ORDER BY step").fetchall() == [(s,) for s in (1, 10, 20, 30, 40, 50)]
    finally:
        con.close()
