"""verl console logs: every trap of FORMATS.md section 1, with values checked by hand."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.ingest import console_lines as cl
from polytrace_cli.ingest.formats.verl.console import WANDB_LINE_LIMIT, _read_lines, parse_metric_line
from polytrace_cli.ingest.sniffing import SNIFF_BYTES, detect, read_head
from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "verl"


def _ingest(store, path: Path):
    reports = ingest_paths(store, [path])
    assert [r.status for r in reports] == ["ingested"] * len(reports), [r.message for r in reports]
    return reports


def _metric(store, step: int, key: str, segment: int = 0):
    rows = store.execute(
        "SELECT value, text_value FROM step_metrics WHERE step = ? AND key = ? AND segment = ?", [step, key, segment]
    ).fetchall()
    assert len(rows) == 1, rows
    return rows[0]


def _meta(store) -> dict:
    return json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])


def _ignored(store) -> dict:
    return dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall())


# --- line cleaning and value parsing: the polars and Python versions agree -------------------

LINES = [
    "\x1b[36m(TaskRunner pid=14640)\x1b[0m step:101 - a:1 [repeated 3x across cluster]",
    "(main_task pid=2) step:1 - a:1.000",
    "(WorkerDict pid=7, ip=10.0.0.1) Loading weights",
    "Training Progress:  16%|███| 71/435 [1:10:40<6:31:06, 64.47s/it]\r",
    "x\r\x1b[36m(TaskRunner pid=3)\x1b[0m step:2 - k:1.0\rTraining Progress:  3%|",
    "step:3 - a:1\r",
    "",
]
CLEANED = ["step:101 - a:1", "step:1 - a:1.000", "Loading weights",
           "Training Progress:  16%|███| 71/435 [1:10:40<6:31:06, 64.47s/it]", "step:2 - k:1.0", "step:3 - a:1", ""]


@pytest.mark.parametrize("line, expected", list(zip(LINES, CLEANED)))
def test_clean_line_python_and_polars_agree(line, expected):
    assert cl.clean_line(line) == expected
    assert cl.clean_lines(pl.Series("raw", [line])).to_list() == [expected]
    if "\r" not in line.rstrip("\r"):
        assert pl.select(cl.clean_expr(pl.lit(line))).item() == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["step:3 - a:1", "\x1b[36m(TaskRunner pid=1)\x1b[0m step:4 - b:2", " 40%|###", "",
                                 "  ", "x [repeated 2x across cluster]", "Training Progress: 1/3", "\x1b[0m"]),
                min_size=1, max_size=5).map("\r".join))
def test_clean_lines_agree_on_carriage_return_pieces(line):
    assert cl.clean_lines(pl.Series("raw", [line])).to_list() == [cl.clean_line(line)]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["\x1b[36m", "\x1b[0m", "\x1b[", "\x1b]0;t\x07", "\x1b]é\x07", "\x07",
                                 "\u00a0", "(TaskRunner pid=1)", "(WorkerDict pid=7, ip=10.0.0.1)", " ", "\t", "é",
                                 "st", "ep:", "step:", "step:5 - a:1", " - ", "b:np.float64(2)",
                                 "[repeated 2x across cluster]", "\r", "(", "x"]),
                min_size=1, max_size=8).map("".join))
def test_clean_lines_shortcut_agrees_with_python(line):
    """Lines whose wrapping lies before `step:` are cleaned by slicing; the result must not change."""
    assert cl.clean_lines(pl.Series("raw", [line, "(A pid=1) " + line])).to_list() == [
        cl.clean_line(line), cl.clean_line("(A pid=1) " + line)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"a", b"\r", b"\n", b"\n\n", b" ", b'"', b",", b"#", b"\xff", b"\xe2\x96",
                                 "\u00e9".encode(), b"\t", b"\x00", b"\xef\xbb\xbf", "\ufffd".encode(),
                                 b"step:1 - a:1"]),
                max_size=12).map(b"".join))
def test_read_lines_splits_like_python(tmp_path_factory, data):
    """The CSV-reader path gives the lines `str.split('\\n')` gives, bad bytes replaced alike."""
    path = tmp_path_factory.mktemp("read") / "train.log"
    path.write_bytes(data)
    expected = data.decode("utf-8", errors="replace").split("\n")
    if expected[-1] == "":
        expected.pop()
    lines = _read_lines(path)
    assert lines.get_column("raw").to_list() == expected
    assert lines.get_column("line_no").to_list() == list(range(1, len(expected) + 1))


VALUES = [
    ("0.123", 0.123, None), ("101.000", 101.0, None), ("-0.000", -0.0, None), ("np.float64(0.25)", 0.25, None),
    ("np.int64(3)", 3.0, None), ("np.float32(1.5)", 1.5, None), ("1e-06", 1e-06, None), ("inf", math.inf, None),
    ("-inf", -math.inf, None), ("True", 1.0, "True"), ("False", 0.0, "False"), ("schedule", None, "schedule"),
    ("tensor(0.5, device='cuda:0')", 0.5, None), ("np.True_", 1.0, "True"), ("numpy.float64(2.5)", 2.5, None),
    ("np.é(1)", None, "np.é(1)"), ("np.float64(1.5", None, "np.float64(1.5"),
    # Text a float parser might take for a number; `_NUMBER` decides.
    ("1_000", None, "1_000"), ("0x10", None, "0x10"), ("1e", None, "1e"), (".", None, "."), ("+", None, "+"),
    ("1.5.", None, "1.5."), ("1e5.5", None, "1e5.5"), ("1.", 1.0, None), ("+.5e+1", 5.0, None),
    ("-Infinity", -math.inf, None),
    # Python's strip also removes \x1c-\x1f inside a wrapper.
    ("tensor(0\x1f, device='cuda:0')", 0.0, None), ("np.float64(\x1c1.5)", 1.5, None),
]


def test_python_whitespace_is_what_str_strip_removes():
    assert set(cl._PYTHON_WHITESPACE) == {chr(c) for c in range(0x110000) if chr(c).isspace()}


@pytest.mark.parametrize("text, value, text_value", VALUES)
def test_scalar_parsing_python_and_polars_agree(text, value, text_value):
    assert cl.parse_scalar(text) == (value, text_value)
    assert _polars_scalar(text) == (value, text_value)


def _polars_scalar(text: str):
    return cl.scalar_columns(pl.DataFrame({"v": [text]}), "v", text="text").select("value", "text").row(0)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(max_size=12),
    st.builds(lambda name, inner: f"np.{name}({inner})", st.sampled_from(["float64", "int64", "é", ""]), st.text(max_size=8)),
    st.builds(lambda inner: f"tensor({inner}, device='cuda:0')", st.text(max_size=8)),
).map(str.strip))
def test_scalar_parsing_agrees_on_any_text(text):
    python_value, python_text = cl.parse_scalar(text)
    polars_value, polars_text = _polars_scalar(text)
    assert polars_text == python_text
    assert (polars_value is None and python_value is None) or math.isclose(polars_value, python_value) or (
        math.isnan(polars_value) and math.isnan(python_value)) or polars_value == python_value


def test_nan_parses_as_nan_in_both():
    assert math.isnan(cl.parse_scalar("nan")[0])
    assert math.isnan(_polars_scalar("nan")[0])


@pytest.mark.parametrize("line", ["  File \"x.py\", line 3", "WARNING: foo", "{'val-core/x': 0.5,", "random",
                                  "Training Progress:  3%|| 1/3 [00:01<00:02, 1.00s/it]", "", "2025-01-05 10:00:00 INFO x",
                                  "RuntimeError: boom", "})"])
def test_noise_rules_python_and_polars_agree(line):
    assert pl.select(cl.noise_rule_expr(pl.lit(line))).item() == cl.classify_noise(line)


def test_parse_metric_line_problems_and_cut_fragment():
    assert parse_metric_line("step:3 - a:1 - b").problem == "pair 2 'b' is not key:value"
    assert parse_metric_line("step:x - a:1").problem.startswith("metric line with a bad step field")
    assert parse_metric_line("step:4").problem == "metric line without key:value pairs"
    cut = parse_metric_line("step:5 - a:1 - b:2 - timing_s/st", cut=True)
    assert (cut.step, cut.pairs, cut.fragment, cut.problem) == (5, [("a", "1"), ("b", "2")], "timing_s/st", None)


# --- whole files --------------------------------------------------------------------------------

def test_v03_console_values_stages_flags_and_meta(store):
    [report] = _ingest(store, FIXTURES / "console_v03" / "train.log")
    assert (report.lines, report.stored, report.ignored, report.rejected) == (15, 3, 12, 0)
    assert _ignored(store) == {"logging": 1, "other": 1, "pprint": 4, "ray-log": 1, "tqdm": 3, "warning": 2}
    steps = store.execute(
        "SELECT step, gen_s, step_s, testing_s, save_checkpoint_s, response_length_mean, clip_ratio,"
        " is_validation_only, has_testing, has_checkpoint FROM steps ORDER BY step"
    ).fetchall()
    assert steps == [
        (0, None, None, None, None, None, None, True, False, False),
        (1, 12.0, 20.0, None, None, 210.5, 0.25, False, False, False),
        (2, 14.0, 30.0, 4.0, 2.5, 300.25, 0.0, False, True, True),
    ]
    assert _metric(store, 1, "actor/pg_loss") == (-0.012, None)
    assert _metric(store, 1, "actor/lr") == (0.0, None)
    meta = _meta(store)
    assert meta["verl_version"] == "<=0.4" and meta["value_precision"] == 0.001
    # 4000 / (100 * 20) = 2 and 6000 / (100 * 30) = 2
    assert meta["n_gpus"] == 2
    assert (meta["max_response_len"], meta["n_sampling"], meta["n_gpus_per_node"], meta["max_prompt_len"]) == (1024, 4, 2, 512)
    assert store.execute("SELECT format_version FROM files").fetchall() == [("verl<=0.4 (.3f values)",)]


def test_v05_repr_values_restart_resume_and_rejections(store):
    [report] = _ingest(store, FIXTURES / "console_v05" / "train.log")
    assert (report.lines, report.stored, report.ignored, report.rejected) == (12, 3, 7, 2)
    assert store.execute("SELECT line_no, reason FROM ingest_errors ORDER BY line_no").fetchall() == [
        (7, "pair 2 'broken_pair' is not key:value"),
        (8, "metric line with a bad step field 'step:abc'"),
    ]
    assert _metric(store, 101, "actor/entropy") == (0.5, None)
    assert _metric(store, 101, "actor/lr") == (1e-06, None)
    assert math.isnan(_metric(store, 101, "actor/grad_norm")[0])
    assert _metric(store, 101, "critic/vf_loss") == (math.inf, None)
    assert _metric(store, 101, "critic/vf_min") == (-math.inf, None)
    assert _metric(store, 101, "actor/is_ok") == (1.0, "True")
    assert _metric(store, 101, "actor/flag") == (0.0, "False")
    assert _metric(store, 101, "num_turns/max") == (3.0, None)
    assert _metric(store, 101, "perf/mfu/actor") == (0.25, None)
    assert _metric(store, 101, "training/global_step") == (101.0, None)
    assert _metric(store, 101, "val-core/openai/gsm8k/reward/mean@1") == (0.75, None)
    assert _metric(store, 101, "timing_s/agent_loop/slowest/response_length") == (512.0, None)
    assert _metric(store, 101, "resize/mode") == (None, "schedule")
    assert _metric(store, 101, "custom/loss(ema).v2-x") == (0.125, None)  # a key with ( ) . - kept whole
    # The metric line after a progress-bar update on the same physical line (carriage return).
    assert _metric(store, 102, "timing_s/step") == (11.0, None)
    # The restart goes back to step 101: a second segment, nothing merged.
    assert _metric(store, 101, "timing_s/gen", segment=1) == (5.0, None)
    flags = store.execute("SELECT segment, step, flag, detail, line_no FROM step_flags ORDER BY line_no").fetchall()
    assert flags == [(0, 101, "resumed", "log starts at step 101", 2),
                     (1, 101, "restart", "step went back from 102 to 101", 12)]
    assert store.execute("SELECT count(*) FROM steps").fetchall()[0][0] == 3
    meta = _meta(store)
    # per step 64000/(800*10) = 8, 72000/(900*11) = 7.27, 80000/(1000*10) = 8: median 8
    assert (meta["verl_version"], meta["n_gpus"], meta["max_response_len"]) == (">=0.5", 8, 4096)
    assert "value_precision" not in meta


def test_a_job_resumed_from_a_checkpoint_starts_a_segment_at_its_next_metric_line(store, tmp_path):
    path = tmp_path / "resumed" / "train.log"
    path.parent.mkdir()
    path.write_text(
        "step:0 - val-core/acc/mean@1:0.5\n"
        "step:1 - timing_s/step:10.0 - timing_s/gen:6.0\n"
        "step:2 - timing_s/step:11.0 - timing_s/gen:7.0\n"
        "*** SIGTERM received at time=1767607200 on cpu 0 (pid 27182) ***\n"
        "\x1b[36m(TaskRunner pid=31)\x1b[0m Load from checkpoint folder: checkpoints/global_step_2\n"
        "step:2 - val-core/acc/mean@1:0.75\n"
        "step:3 - timing_s/step:20.0 - timing_s/gen:16.0\n"
    )
    [report] = _ingest(store, path)
    assert (report.lines, report.stored, report.ignored, report.rejected) == (7, 5, 2, 0)
    assert store.execute("SELECT rule, lines FROM ignored_lines ORDER BY rule").fetchall() == [
        ("checkpoint-load", 1), ("other", 1)]
    assert store.execute("SELECT segment, step, key, value FROM step_metrics WHERE key LIKE 'val%' OR key = 'timing_s/step'"
                         " ORDER BY line_no").fetchall() == [
        (0, 0, "val-core/acc/mean@1", 0.5), (0, 1, "timing_s/step", 10.0), (0, 2, "timing_s/step", 11.0),
        (1, 2, "val-core/acc/mean@1", 0.75), (1, 3, "timing_s/step", 20.0)]
    assert store.execute("SELECT segment, step, flag, detail, line_no FROM step_flags WHERE flag = 'restart'"
                         ).fetchall() == [(1, 2, "restart", "resumed from a checkpoint after step 2", 6)]


def test_global_step_mid_line_is_not_a_metric_line(store):
    _ingest(store, FIXTURES / "console_v05" / "train.log")
    assert store.execute("SELECT count(*) FROM step_metrics WHERE step = 102 AND key = 'to'").fetchall()[0][0] == 0
    assert store.execute("SELECT DISTINCT step FROM step_metrics ORDER BY step").fetchall() == [(101,), (102,)]


def test_crash_before_step_one_is_zero_steps_with_a_note(store):
    [report] = _ingest(store, FIXTURES / "crash" / "train.log")
    assert (report.lines, report.stored, report.ignored, report.rejected, report.rows) == (5, 0, 5, 0, 0)
    assert report.notes == ["zero steps: the log ends before step 1; the job died before its first step: "
                            "torch.OutOfMemoryError: "
                            "CUDA out of memory. Tried to allocate 2.00 GiB."]
    meta = _meta(store)
    assert (meta["n_gpus"], meta["n_sampling"], meta["max_response_len"]) == (8, 8, 8192)
    assert store.execute("SELECT framework FROM runs").fetchall() == [("verl",)]


def test_tqdm_is_the_step_time_fallback_without_metric_lines(store):
    [report] = _ingest(store, FIXTURES / "tqdm_only" / "train.log")
    assert (report.lines, report.stored, report.ignored) == (5, 3, 2)
    steps = store.execute("SELECT step, round(step_s, 3), flags FROM steps ORDER BY step").fetchall()
    # elapsed 0 -> 64 -> 130 -> 200 s at counts 0..3; count 71 at 1:10:40 = 4240 s: (4240 - 200) / 68
    assert steps == [(1, 64.0, ["tqdm_estimate"]), (2, 66.0, ["tqdm_estimate"]), (3, 70.0, ["tqdm_estimate"]),
                     (71, round(4040 / 68, 3), ["tqdm_estimate"])]
    assert _metric(store, 71, "tqdm/s_per_it") == (64.47, None)
    assert _metric(store, 71, "tqdm/elapsed_s") == (4240.0, None)


def _wandb_cut_log(folder: Path) -> Path:
    pairs = " - ".join(f"val-aux/task{i:03d}/reward/mean@8:0.{i:03d}" for i in range(200))
    line = "step:0 - " + pairs + " - timing_s/step:99.5"
    cut = line[:WANDB_LINE_LIMIT]
    assert len(cut) == WANDB_LINE_LIMIT
    folder.mkdir(parents=True)
    path = folder / "output.log"
    path.write_text(cut + "\nstep:1 - timing_s/step:42.0 - timing_s/gen:30.0\n")
    return path, cut


def test_wandb_cut_line_keeps_complete_pairs_and_flags_the_step(store, tmp_path):
    path, cut = _wandb_cut_log(tmp_path / "wandb" / "run-20250105_100000-abc" / "files")
    [report] = _ingest(store, path)
    complete = cut.split(" - ")[1:-1]
    assert report.rejected == 0 and report.stored == 2
    keys = store.execute("SELECT key FROM step_metrics WHERE step = 0 ORDER BY line_no, rowid").fetchall()
    assert [k for (k,) in keys] == [pair.split(":")[0] for pair in complete]
    flag = store.execute("SELECT step, flag, detail FROM step_flags").fetchall()
    assert flag == [(0, "truncated_line", f"line cut at 4096 characters; fragment dropped: {cut.split(' - ')[-1]!r}")]
    assert store.execute("SELECT step, truncated_line, step_s FROM steps ORDER BY step").fetchall() == [
        (0, True, None), (1, False, 42.0)]


def test_sniffing_by_content_and_by_head_markers(tmp_path):
    head = (FIXTURES / "console_v05" / "train.log").read_bytes()
    assert detect(Path("anything.bin"), head).name == "verl-console"
    noise = "(TaskRunner pid=9) Using dataset class: RLHFDataset\n" + "(WorkerDict pid=3) loading shard\n" * 3000
    late = tmp_path / "stdout.txt"
    late.write_text(noise + "step:1 - timing_s/step:3.5\n")
    assert late.stat().st_size > SNIFF_BYTES
    assert detect(late, read_head(late)).name == "verl-console"
    # Without a metric line and with a name that is not a log, a Ray job's output is not claimed.
    other = tmp_path / "notes.md"
    other.write_text(noise)
    assert detect(other, read_head(other)) is None or detect(other, read_head(other)).name != "verl-console"


def test_cli_ingest_runs_and_steps_over_a_mixed_folder(tmp_path, db_path):
    folder = tmp_path / "logs"
    shutil.copytree(FIXTURES, folder)
    runner = CliRunner()
    result = runner.invoke(app, ["ingest", "--db", str(db_path), str(folder), "--json"])
    assert result.exit_code == 0, result.output
    formats = {Path(r["path"]).relative_to(folder.resolve()).as_posix(): r["format"] for r in json.loads(result.stdout)}
    assert formats["console_v03/train.log"] == "verl-console"
    assert formats["crash/train.log"] == "verl-console"
    result = runner.invoke(app, ["query", "--db", str(db_path), "--json",
                                 "SELECT r.name, min(s.step) AS first, max(s.step) AS last, sum(s.step_s) AS step_s"
                                 " FROM steps s JOIN runs r USING (run_id) GROUP BY r.name ORDER BY r.name"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: (row["first"], row["last"], row["step_s"]) for row in json.loads(result.stdout)}
    assert rows["console_v03"] == (0, 2, 50.0)
    assert rows["console_v05"] == (101, 102, 31.0)
    result = runner.invoke(app, ["runs", "--db", str(db_path), "--json"])
    assert result.exit_code == 0, result.output
    runs = {run["run"]: run for run in json.loads(result.stdout)}
    assert (runs["console_v05"]["first_step"], runs["console_v05"]["last_step"], runs["console_v05"]["segments"]) == (101, 102, 2)
    assert (runs["crash"]["steps"], runs["crash"]["framework"]) == (0, "verl")
