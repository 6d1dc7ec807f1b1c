"""Reports end to end: every figure rendered for the sample logs and the real traces, files non-trivial,
the HTML referencing each figure, omissions explained, and T1 against hand-computed numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import matplotlib.image
import polars as pl
import pytest
from typer.testing import CliRunner

import schema_check
from conftest import PROJECT_ROOT, need_real_data
from polytrace_cli.analyze.common import ALL_STEPS
from polytrace_cli.analyze.registry import all_analyses
from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.report.figures import FIGURE_MODULES, figure_modules
from polytrace_cli.report.figures.base import Omitted
from polytrace_cli.report.writer import build_report, default_name
from polytrace_cli.schemas import json_schema
from polytrace_cli.store import open_store

SAMPLE_LOGS = PROJECT_ROOT / "sample_logs"
runner = CliRunner()


def ingest_tasks(db: Path, root: Path, tasks: list[str]) -> None:
    con = open_store(db)
    try:
        for task in tasks:
            reports = ingest_paths(con, [root / task], task=task)
            assert not [r for r in reports if r.failed], f"{task} did not ingest"
    finally:
        con.close()


def assert_non_blank_png(path: Path) -> None:
    """A PNG of real size whose pixels vary (a blank or single-colour image has ~zero variance)."""
    assert path.stat().st_size > 5_000, f"{path.name} is suspiciously small"
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 300
    assert float(pixels[..., :3].std()) > 0.02, f"{path.name} looks blank"


def assert_report_complete(index: Path, svg: bool = False) -> dict:
    """Every drawn figure exists as PNG (and as SVG when the report was asked for `svg`, else no SVG is
    written or linked), is non-blank and referenced by the HTML and summary.md; every omitted one says
    why in both; nothing failed. Returns summary.json."""
    folder = index.parent
    html = index.read_text()
    markdown = (folder / "summary.md").read_text()
    summary = json.loads((folder / "summary.json").read_text(),
                         parse_constant=lambda token: pytest.fail(f"summary.json holds {token}, which is not JSON"))
    schema_check.validate(summary, json_schema("summary"), cls=jsonschema.Draft202012Validator)
    assert set(summary["analyses"]) == set(all_analyses())
    assert summary["analysis_errors"] == {}
    assert len(summary["figures"]) == len(FIGURE_MODULES)
    drawn_files = sorted(p.name for p in (folder / "figures").glob("*.png"))
    assert drawn_files == sorted(f["png"] for f in summary["figures"] if f["png"])
    modules = {module.ID: module for module in figure_modules()}
    assert set(summary["figure_data"]) == {f["id"] for f in summary["figures"] if f["png"]}
    for figure in summary["figures"]:
        assert figure["failed"] is None, f"{figure['id']} failed: {figure['failed']}"
        if figure["png"]:
            # The numbers behind the figure: the rows of each analysis frame it was drawn from.
            data = summary["figure_data"][figure["id"]]
            assert set(data) == set(modules[figure["id"]].FRAMES)
            assert any(rows for rows in data.values())
            assert_non_blank_png(folder / "figures" / figure["png"])
            assert f"data-figure='{figure['png']}'" in html and f"figures/{figure['png']}" in markdown
            if svg:
                svg_file = folder / "figures" / figure["svg"]
                assert svg_file.stat().st_size > 5_000 and svg_file.read_text().lstrip().startswith("<?xml")
                assert f"figures/{figure['svg']}" in html and f"figures/{figure['svg']}" in markdown
            else:
                assert figure["svg"] is None
        else:
            assert figure["omitted"], f"{figure['id']} neither drawn nor explained"
            assert f"omitted: {figure['omitted']}" in markdown
            assert re.search(rf"<strong>{figure['id']} [^<]*</strong>: omitted: ", html)
    if not svg:
        assert not list((folder / "figures").glob("*.svg")) and ".svg" not in html and ".svg" not in markdown
    # Self-contained: figures inline, no network fetches.
    assert html.count("data:image/png;base64,") == len(drawn_files)
    assert not re.search(r"""(src|href)=['"]https?://""", html)
    return summary


@pytest.fixture(scope="module")
def sample_report(tmp_path_factory) -> Path:
    if not (SAMPLE_LOGS / "math").exists():
        pytest.skip("sample_logs/ not generated (polytrace demo)")
    folder = tmp_path_factory.mktemp("sample-report")
    db = folder / "store.duckdb"
    ingest_tasks(db, SAMPLE_LOGS, ["math", "code", "search"])
    result = runner.invoke(app, ["report", "--db", str(db), "--out", str(folder / "reports"), "--svg"])
    assert result.exit_code == 0, result.output
    index = Path(result.output.strip().splitlines()[-1])
    assert index == folder / "reports" / "math+code+search" / "index.html"
    return index


def test_sample_logs_report_is_complete(sample_report):
    summary = assert_report_complete(sample_report, svg=True)
    drawn = {f["id"] for f in summary["figures"] if f["png"]}
    # The sample logs carry per-sample lengths on DP ranks, reward timings, DAPO batches and trajectories.
    assert {"F1", "F2", "F3", "F6", "F7", "F8", "F9", "F10"} <= drawn
    assert [row["run"] for row in summary["table_T1"]] == ["code", "math", "search"]


def test_sample_logs_report_omits_step_time_figures_with_a_reason(sample_report):
    """The PolyTrace traces have no step timings: F4, F5 and F11 are left out, not drawn empty."""
    summary = json.loads((sample_report.parent / "summary.json").read_text())
    by_id = {f["id"]: f for f in summary["figures"]}
    for figure_id in ("F4", "F5", "F11"):
        assert by_id[figure_id]["png"] is None
        assert "step" in by_id[figure_id]["omitted"]


def test_single_run_report_with_name_and_step_range(tmp_path):
    if not (SAMPLE_LOGS / "code").exists():
        pytest.skip("sample_logs/ not generated (polytrace demo)")
    db = tmp_path / "store.duckdb"
    ingest_tasks(db, SAMPLE_LOGS, ["code"])
    result = runner.invoke(app, ["report", "code", "--db", str(db), "--out", str(tmp_path / "r"), "--name", "ci",
                                 "--steps", "1:3"])
    assert result.exit_code == 0, result.output
    index = tmp_path / "r" / "ci" / "index.html"
    assert result.output.strip() == str(index)
    summary = assert_report_complete(index)
    steps_row = next(r for r in summary["analyses"]["lengths"] if r["kind"] == "response")
    assert steps_row["steps"] == 3


@pytest.mark.realdata
@pytest.mark.parametrize("trace", ["verl", "rllm", "search_r1"])
def test_real_trace_report(tmp_path, trace):
    source = need_real_data("polytrace", trace)
    db = tmp_path / "store.duckdb"
    con = open_store(db)
    try:
        reports = ingest_paths(con, [source], run_name=trace)
        assert not [r for r in reports if r.failed]
    finally:
        con.close()
    result = runner.invoke(app, ["report", "--db", str(db), "--out", str(tmp_path / "r"), "--svg"])
    assert result.exit_code == 0, result.output
    summary = assert_report_complete(tmp_path / "r" / trace / "index.html", svg=True)
    drawn = {f["id"] for f in summary["figures"] if f["png"]}
    assert {"F1", "F2", "F3", "F7"} <= drawn
    expected = {"verl": {"F6", "F10"}, "rllm": {"F6", "F9"}, "search_r1": {"F8"}}[trace]
    missing = expected - drawn
    reasons = {f["id"]: f["omitted"] for f in summary["figures"] if f["id"] in missing}
    assert not missing - _unavailable(summary), f"not drawn: {reasons}"


def _unavailable(summary: dict) -> set[str]:
    """Figures whose analysis is not installed (they say so); everything else must be drawn."""
    return {f["id"] for f in summary["figures"] if f["omitted"] and "not available" in f["omitted"]}


def test_report_of_an_empty_store_is_one_line_error(tmp_path):
    db = tmp_path / "store.duckdb"
    open_store(db).close()
    result = runner.invoke(app, ["report", "--db", str(db), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "no runs" in result.output and "Traceback" not in result.output


def test_report_unknown_run_is_one_line_error(tmp_path):
    db = tmp_path / "store.duckdb"
    open_store(db).close()
    result = runner.invoke(app, ["report", "nope", "--db", str(db), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "no run named nope" in result.output


def test_svg_is_opt_in_and_a_later_report_without_it_leaves_no_stale_svg(tmp_path):
    db = tmp_path / "store.duckdb"
    _console_log(tmp_path / "logs" / "a" / "train.log", 12, 10.0, 6)
    result = runner.invoke(app, ["ingest", str(tmp_path / "logs" / "a"), "--run", "a", "--db", str(db)])
    assert result.exit_code == 0, result.output
    report = ["report", "--db", str(db), "--out", str(tmp_path / "r")]
    assert runner.invoke(app, [*report, "--svg"]).exit_code == 0
    summary = assert_report_complete(tmp_path / "r" / "a" / "index.html", svg=True)
    assert {f["svg"] for f in summary["figures"] if f["png"]} == {p.name for p in (tmp_path / "r" / "a" / "figures").glob("*.svg")}
    assert runner.invoke(app, report).exit_code == 0
    assert_report_complete(tmp_path / "r" / "a" / "index.html")


def test_one_pass_png_has_the_pixels_of_savefig(tmp_path):
    """style.save_png paints a figure in one draw, which lays it out (`layout.MeasuredGrid`); Figure.savefig
    may draw it twice. The pixels must be the same (a colour bar and log axes exercise the layout)."""
    import numpy as np

    from polytrace_cli.report import style

    def draw():
        figure, axes = style.new_figure(2, 1)
        art = axes[0].hexbin(np.geomspace(10, 5000, 400), np.geomspace(50, 9000, 400) ** 0.9, gridsize=20,
                             xscale="log", yscale="log", bins="log", mincnt=1)
        style.plain_colorbar(style.add_colorbar(figure, art, [axes[0]], label="samples"))
        style.plot_steps(axes[1], [1, 2, 3, 5, 6], [3.0, 4.0, 2.0, 5.0, 1.0], label="step")
        axes[1].set_title("a title\non two lines")
        figure.suptitle("Not shown (no data): b")
        return figure

    draw().savefig(tmp_path / "savefig.png")
    style.save_png(draw(), tmp_path / "one_pass.png")
    before, after = (matplotlib.image.imread(tmp_path / name) for name in ("savefig.png", "one_pass.png"))
    assert before.shape[:2] == after.shape[:2] and before.shape[0] > 300
    # The figure is opaque, so its PNG is written without the alpha channel (same colours).
    assert before.shape[2] == 4 and after.shape[2] == 3 and (before[..., 3] == 1).all()
    assert np.array_equal(before[..., :3], after)


def test_a_report_runs_without_automatic_gc_and_leaves_it_as_it_found_it(sample_report, tmp_path, monkeypatch):
    import gc

    from polytrace_cli.facade import Store
    from polytrace_cli.report import writer

    seen = []
    real = writer.write_runs_report

    def spying(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(writer, "write_runs_report", spying)
    db = sample_report.parent.parent.parent / "store.duckdb"
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            Store.write_report(db, runs=["code"], out=tmp_path, name=f"gc-{enabled}")  # one run is enough
            assert gc.isenabled() is enabled
        finally:
            gc.enable()
    assert seen == [False, False]


def test_a_figure_with_transparent_pixels_keeps_its_alpha_channel(tmp_path):
    from polytrace_cli.report import style

    figure, axes = style.new_figure()
    axes[0].plot([1, 2, 3], [3, 1, 2])
    figure.patch.set_alpha(0.0)
    style.save_png(figure, tmp_path / "clear.png")
    pixels = matplotlib.image.imread(tmp_path / "clear.png")
    assert pixels.shape[2] == 4 and pixels[..., 3].min() == 0 and pixels[..., 3].max() == 1


def test_shared_computes_each_frame_once_per_report_only(tmp_path):
    from polytrace_cli.analyze.shared_frames import once_per_report, shared

    calls = []

    def frame(con, run_ids, steps):
        calls.append((tuple(run_ids), steps))
        return pl.DataFrame({"run": [str(run_ids)]})

    first = shared(frame, None, [1, 2], ALL_STEPS)
    assert shared(frame, None, [1, 2], ALL_STEPS) is not first and len(calls) == 2  # outside: no sharing
    with once_per_report():
        inside = shared(frame, None, [1, 2], ALL_STEPS)
        assert shared(frame, None, [1, 2], ALL_STEPS) is inside  # equal run-id lists share one frame
        assert shared(frame, None, [2], ALL_STEPS) is not inside
    assert calls == [((1, 2), ALL_STEPS)] * 3 + [((2,), ALL_STEPS)]
    with once_per_report():  # a new report computes afresh
        assert shared(frame, None, [1, 2], ALL_STEPS) is not inside


def test_a_report_computes_imbalance_per_step_and_longtail_per_rank_once(sample_report, tmp_path, monkeypatch):
    """F6, F12 and the imbalance summary read one per-step λ frame (with its balanced counterfactual);
    F7 and the longtail summary one per-rank frame."""
    from polytrace_cli.analyze import imbalance, longtail
    from polytrace_cli.store.queries import run_ids

    calls = []

    def counting(function):
        def counted(*args):
            calls.append(function.__name__)
            return function(*args)
        return counted

    monkeypatch.setattr(imbalance, "per_step", counting(imbalance.per_step))
    monkeypatch.setattr(longtail, "per_rank", counting(longtail.per_rank))
    con = open_store(sample_report.parent.parent.parent / "store.duckdb", read_only=True)
    try:
        report = build_report(con, run_ids(con, None), tmp_path / "out")
    finally:
        con.close()
    drawn = {figure.id for figure in report.figures if figure.png}
    assert {"F6", "F7", "F12"} <= drawn and {"imbalance", "longtail"} <= set(report.summaries)
    assert sorted(calls) == ["per_rank", "per_step"]


def test_a_report_reads_each_runs_workload_once(tmp_path, monkeypatch):
    """explain (findings), whatif and the backtest (what would help) all model run a; the report reads its
    workload frame once, and the frame is the one read_workload gives outside a report."""
    from polytrace_cli.analyze.shared_frames import once_per_report
    from polytrace_cli.model import read_workload
    from polytrace_cli.model import workload as workload_module
    from polytrace_cli.store.queries import run_ids

    db = tmp_path / "store.duckdb"
    _console_log(tmp_path / "logs" / "a" / "train.log", 12, 10.0, 6)
    assert runner.invoke(app, ["ingest", str(tmp_path / "logs" / "a"), "--run", "a", "--db", str(db)]).exit_code == 0
    reads = []
    real = workload_module._workload_frame
    monkeypatch.setattr(workload_module, "_workload_frame", lambda con, info: reads.append(info.run_id) or real(con, info))
    con = open_store(db, read_only=True)
    try:
        (run_id,) = run_ids(con, ["a"])
        alone = read_workload(con, "a")
        report = build_report(con, [run_id], tmp_path / "out")
        assert [f for f in report.findings if "at_steps" in f] and [h for h in report.help if h.get("backtest")]
        assert reads == [run_id, run_id]  # once alone, once for the whole report
        with once_per_report():
            assert read_workload(con, "a") is read_workload(con, run_id)
            assert read_workload(con, "a").equals(alone)
        assert read_workload(con, "a") is not alone
    finally:
        con.close()


def test_findings_run_explain_only_on_runs_it_models_in_seconds(tmp_path, monkeypatch):
    """Run a logs step times (explain models it in seconds); run b has samples only, whose token-based
    explanation the findings would not use, so explain is not run on it."""
    from polytrace_cli import diagnose
    from polytrace_cli.diagnose.explain import explained_in_seconds
    from polytrace_cli.model import read_workload
    from polytrace_cli.report.findings import build_findings
    from polytrace_cli.store.queries import run_ids

    db = tmp_path / "store.duckdb"
    _console_log(tmp_path / "logs" / "a" / "train.log", 12, 10.0, 6)
    assert runner.invoke(app, ["ingest", str(tmp_path / "logs" / "a"), "--run", "a", "--db", str(db)]).exit_code == 0
    con = open_store(db)
    try:
        b = _insert_samples(con, "b", "math", [(step, 0, i, 10, 100 + 50 * i) for step in range(12) for i in range(4)])
        (a,) = run_ids(con, ["a"])
        assert explained_in_seconds(read_workload(con, a)) and not explained_in_seconds(read_workload(con, b))
        explained, real = [], diagnose.explain_run
        monkeypatch.setattr(diagnose, "explain_run", lambda con, run, *args: explained.append(run) or real(con, run, *args))
        findings = build_findings(con, [a, b], ALL_STEPS, {})
    finally:
        con.close()
    assert explained == [a]
    assert {f["run"] for f in findings if "at_steps" in f} == {"a"}


def test_default_name():
    assert default_name(["math", "code"]) == "math+code"
    assert default_name(["a b/c"]) == "a-b-c"
    assert len(default_name([f"run{i:03d}" for i in range(40)])) <= 80


def test_every_figure_omits_on_empty_frames():
    """A figure given frames with no rows returns Omitted with a reason instead of empty axes."""
    for module in figure_modules():
        result = module.render({name: pl.DataFrame() for name in module.FRAMES})
        assert isinstance(result, Omitted) and result.reason, module.ID


def _insert_samples(con, run: str, task: str, rows: list[tuple]) -> int:
    """rows: (step, dp_rank, prompt_idx, prompt_len, response_len)."""
    run_id = con.execute("INSERT INTO runs (run_id, name, task, framework) VALUES (nextval('run_id_seq'), ?, ?, 'test') "
                         "RETURNING run_id", [run, task]).fetchall()[0][0]
    con.executemany(
        "INSERT INTO sample_rows (run_id, file_id, step, rank, dp_rank, tp_rank, prompt_idx, sample_idx, prompt_len, response_len) "
        "VALUES (?, 0, ?, ?, ?, 0, ?, 0, ?, ?)",
        [(run_id, s, r, r, p, pl_, rl) for s, r, p, pl_, rl in rows],
    )
    return run_id


def test_t1_numbers_by_hand(tmp_path):
    """Two runs with hand-made samples: T1's means, p99/p50 and λ match arithmetic on the rows."""
    con = open_store(tmp_path / "store.duckdb")
    try:
        # run a: one step, rank 0 loads 10+90 + 10+110 = 220, rank 1 loads 20+180 + 20+200 = 420.
        a = _insert_samples(con, "a", "math", [(0, 0, 0, 10, 90), (0, 0, 1, 10, 110), (0, 1, 2, 20, 180), (0, 1, 3, 20, 200)])
        # run b: one rank only, so no λ; responses 100, 100, 100, 500.
        b = _insert_samples(con, "b", "code", [(0, 0, 0, 50, 100), (0, 0, 1, 50, 100), (0, 0, 2, 50, 100), (0, 0, 3, 50, 500)])
        report = build_report(con, [a, b], tmp_path / "out", None, ALL_STEPS)
    finally:
        con.close()
    table = {row["run"]: row for row in report.table.to_dicts()}
    assert table["a"]["task"] == "math" and table["a"]["samples"] == 4 and table["a"]["workload_steps"] == 1
    assert table["a"]["trainer_steps"] is None  # a trace without DAPO batches does not say
    assert table["a"]["mean_prompt_tokens"] == pytest.approx(15.0)
    assert table["a"]["mean_response_tokens"] == pytest.approx(145.0)
    # λ = max load / mean load = 420 / 320.
    assert table["a"]["lambda"] == pytest.approx(420 / 320)
    assert table["b"]["lambda"] is None
    # b's responses: p50 = 100; p99 = 100 + 0.97 * 400 (linear interpolation between the 3rd and 4th value).
    assert table["b"]["response_p99_p50"] == pytest.approx((100 + 0.97 * 400) / 100)
    assert table["b"]["mean_response_tokens"] == pytest.approx(200.0)
    assert table["a"]["step_time_cv"] is None


def test_joint_histogram_by_hand(tmp_path):
    """k = 1 bin per factor e: l in [e^b, e^(b+1)) is bin b, reported at e^(b + 0.5)."""
    import math

    from polytrace_cli.analyze.lengths import joint_histogram

    con = open_store(tmp_path / "store.duckdb")
    try:
        # ln 10 = 2.30 -> bin 2; ln 15 = 2.71 -> bin 2; ln 100 = 4.61 -> bin 4; ln 3 = 1.10 -> bin 1.
        run = _insert_samples(con, "a", "math", [(0, 0, 0, 10, 100), (0, 0, 1, 15, 100), (0, 0, 2, 3, 100),
                                                   (0, 0, 3, 10, 0)])
        frame = joint_histogram(con, [run], ALL_STEPS, bins_per_e=1)
    finally:
        con.close()
    rows = [(round(r["prompt_tokens"], 6), round(r["response_tokens"], 6), r["count"]) for r in frame.to_dicts()]
    # The zero-length response is left out.
    assert rows == [(round(math.exp(1.5), 6), round(math.exp(4.5), 6), 1),
                    (round(math.exp(2.5), 6), round(math.exp(4.5), 6), 2)]


def test_multi_run_figures_overlay_one_line_per_run(tmp_path):
    """F1 over two runs: each panel has one CDF line per run, labelled with the run name, in distinct colours."""
    from polytrace_cli.report.figures import f01_length_cdf

    con = open_store(tmp_path / "store.duckdb")
    try:
        a = _insert_samples(con, "a", "math", [(0, 0, i, 10 + i, 100 + 10 * i) for i in range(20)])
        b = _insert_samples(con, "b", "code", [(0, 0, i, 50 + i, 1000 + 100 * i) for i in range(20)])
        figure = f01_length_cdf.render(f01_length_cdf.frames(con, [a, b], ALL_STEPS))
    finally:
        con.close()
    for ax in figure.axes:
        lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
        assert [line.get_label() for line in lines] == ["a", "b"]
        assert lines[0].get_color() != lines[1].get_color()


def _console_log(path: Path, steps: int, gen_base: float, slow_step: int) -> None:
    """A verl console log: per step stage timers, step time and response length aggregates."""
    lines = ["(TaskRunner pid=1) {'data': {'max_response_length': 4096}}"]
    for step in range(1, steps + 1):
        gen = gen_base + step + (40.0 if step == slow_step else 0.0)
        max_len = 1000 + 100 * step
        lines.append(f"(TaskRunner pid=1) step:{step} - timing_s/gen:{gen} - timing_s/reward:2.0 - "
                     f"timing_s/old_log_prob:3.0 - timing_s/update_actor:5.0 - timing_s/step:{gen + 11.0} - "
                     f"response_length/mean:{max_len / 2} - response_length/max:{max_len} - "
                     f"response_length/min:10 - response_length/clip_ratio:0.0")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_console_runs_draw_step_time_figures_and_compare_in_t1(tmp_path):
    """Two verl console logs: F4, F5 and F11 are drawn (one panel or line per run), and T1 holds each
    run's step-time CV, which for run a (step times 21..32 plus 40 s at step 6) is checked by hand."""
    import statistics

    db = tmp_path / "store.duckdb"
    _console_log(tmp_path / "logs" / "a" / "train.log", 12, 10.0, 6)
    _console_log(tmp_path / "logs" / "b" / "train.log", 12, 30.0, 0)
    for run in ("a", "b"):
        result = runner.invoke(app, ["ingest", str(tmp_path / "logs" / run), "--run", run, "--task", "math",
                                     "--db", str(db)])
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["report", "--db", str(db), "--out", str(tmp_path / "r"), "--name", "console"])
    assert result.exit_code == 0, result.output
    summary = assert_report_complete(tmp_path / "r" / "console" / "index.html")
    drawn = {f["id"] for f in summary["figures"] if f["png"]}
    assert {"F2", "F4", "F5", "F11"} <= drawn
    # No per-sample data: the sample figures say so instead of drawing.
    omitted = {f["id"]: f["omitted"] for f in summary["figures"] if f["omitted"]}
    assert {"F3", "F6"} <= set(omitted)
    table = {row["run"]: row for row in summary["table_T1"]}
    step_times = [10.0 + s + (40.0 if s == 6 else 0.0) + 11.0 for s in range(1, 13)]
    expected_cv = statistics.stdev(step_times) / statistics.mean(step_times)
    assert table["a"]["step_time_cv"] == pytest.approx(expected_cv)
    steady = [30.0 + s + 11.0 for s in range(1, 13)]
    assert table["b"]["step_time_cv"] == pytest.approx(statistics.stdev(steady) / statistics.mean(steady))


def test_demo_writes_the_demo_report_and_prints_its_path(demo_run):
    result, folder = demo_run
    assert result.exit_code == 0, result.output
    index = folder / "reports" / "demo" / "index.html"
    assert result.output.strip().splitlines()[-1] == str(index)
    assert "more column" not in result.output  # the runs table is whole, as `polytrace runs` prints it
    summary = assert_report_complete(index)
    assert summary["runs"] == ["math", "code", "search", "math-verl"]
    assert {"F1", "F3", "F6", "F8", "F10"} <= {f["id"] for f in summary["figures"] if f["png"]}


def test_multi_panel_figures_draw_only_the_panels_with_data():
    """F8 with only cache hits and F10 with only batches per trainer step: one panel each, no blank axes."""
    from polytrace_cli.report.figures import f08_tool_calls, f10_dapo_filtering

    cache = pl.DataFrame({"run": ["a", "a", "a"], "turn": [0, 1, 2], "hit_ratio": [0.0, 0.8, 0.9]})
    f8 = f08_tool_calls.render({"latency": pl.DataFrame(), "turns": pl.DataFrame(), "cache": cache})
    assert [ax.get_title() for ax in f8.axes] == ["Cache hit by turn"]
    trainer = pl.DataFrame({"run": ["a"] * 3, "trainer_step": [0, 1, 2], "batches": [1, 2, 1]})
    f10 = f10_dapo_filtering.render({"batches": pl.DataFrame(), "trainer_steps": trainer})
    assert [ax.get_title() for ax in f10.axes] == ["Generation batches per trainer step"]
    assert len(f10.axes[0].patches) == 3  # three bars: few steps are drawn as bars


def _without_timings(summary: dict) -> dict:
    for figure in summary["figures"]:
        figure.pop("seconds")
    return summary


def assert_same_numbers(left, right, path: str = "") -> None:
    """Equal JSON documents, floats to 1e-9 relative: DuckDB sums floats in parallel, in an order that
    can change the last digits from one query to the next."""
    assert type(left) is type(right), path
    if isinstance(left, dict):
        assert left.keys() == right.keys(), path
        for key in left:
            assert_same_numbers(left[key], right[key], f"{path}/{key}")
    elif isinstance(left, list):
        assert len(left) == len(right), path
        for index, (a, b) in enumerate(zip(left, right)):
            assert_same_numbers(a, b, f"{path}[{index}]")
    elif isinstance(left, float):
        assert left == pytest.approx(right, rel=1e-9, abs=1e-12), path
    else:
        assert left == right, path


def test_the_command_lines_two_process_report_equals_the_one_process_report(sample_report, tmp_path):
    """`polytrace report` run as a command computes the numbers in a forked child; in-process (as the
    fixture ran it) everything is computed in one process. The pages must be the same."""
    import os
    import subprocess
    import sys

    db = sample_report.parent.parent.parent / "store.duckdb"
    completed = subprocess.run(
        [sys.executable, "-m", "polytrace_cli.cli", "report", "--db", str(db), "--out", str(tmp_path), "--svg"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert completed.returncode == 0, completed.stderr
    index = Path(completed.stdout.strip().splitlines()[-1])
    forked = _without_timings(json.loads((index.parent / "summary.json").read_text()))
    alone = _without_timings(json.loads((sample_report.parent / "summary.json").read_text()))
    assert_same_numbers(forked, alone)
    assert sorted(p.name for p in (index.parent / "figures").iterdir()) == \
        sorted(p.name for p in (sample_report.parent / "figures").iterdir())


@pytest.mark.parametrize("name", ["a/b", "..", " "])
def test_a_report_name_that_is_not_a_plain_folder_name_is_one_line_error(tmp_path, name):
    result = runner.invoke(app, ["report", "--db", str(tmp_path / "none.duckdb"), "--name", name])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: --name must be a plain folder name")
    assert len(result.output.strip().splitlines()) == 1


def test_the_first_process_of_a_report_loads_neither_scipy_nor_scikit_learn(sample_report, tmp_path):
    """The command's first process draws the figures and computes the numbers that need neither library
    (0.15–0.9 s to import); the modelled numbers, which do, come from the second process (here a stand-in)."""
    import os
    import subprocess
    import sys

    db = sample_report.parent.parent.parent / "store.duckdb"
    script = f"""
import sys
from polytrace_cli.report.numbers import ModelledNumbers, compute_numbers
from polytrace_cli.report.writer import build_report
from polytrace_cli.ingest.registry import declared_metric_names
from polytrace_cli.store import open_store
from polytrace_cli.store.queries import run_ids

con = open_store({str(db)!r}, read_only=True, metric_names=declared_metric_names)
ids = run_ids(con, None)
modelled = ModelledNumbers(explained={{i: (None, None) for i in ids}}, model_help={{i: None for i in ids}})
report = build_report(con, ids, {str(tmp_path)!r}, numbers=lambda c, r, s: compute_numbers(c, r, s, lambda: modelled))
assert {{"lengths", "longtail", "tools", "filtering"}} <= set(report.summaries), report.summaries
print(sorted(name for name in ("scipy", "sklearn") if name in sys.modules))
"""
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


def test_no_text_of_a_drawn_figure_overlaps_another(sample_report):
    """Every figure of the sample report, laid out as it is painted: no tick label, title, axis label, point
    label or legend entry overlaps another (matplotlib's text extents)."""
    from test_report_figures_fit import assert_texts_apart

    con = open_store(sample_report.parent.parent.parent / "store.duckdb", read_only=True)
    try:
        ids = [row[0] for row in con.execute("SELECT run_id FROM runs ORDER BY run_id").fetchall()]
        drawn = 0
        for module in figure_modules():
            figure = module.render(module.frames(con, ids, ALL_STEPS))
            if not isinstance(figure, Omitted):
                assert_texts_apart(figure)
                drawn += 1
    finally:
        con.close()
    assert drawn >= 8


def test_the_top_of_the_sample_report_stays_within_its_word_budget(sample_report):
    from test_report_findings import top_words

    from polytrace_cli.report.top import TOP_WORDS_PER_RUN

    runs = json.loads((sample_report.parent / "summary.json").read_text())["runs"]
    assert 0 < top_words(sample_report) <= TOP_WORDS_PER_RUN * len(runs)
