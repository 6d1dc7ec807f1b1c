"""The report's answers and honesty: Findings and What would help first, runs left out named, no line across
missing steps, slow steps only in F5 with labels that do not overlap, and F6 without blank panels."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from polytrace_cli.analyze import imbalance
from polytrace_cli.analyze.common import ALL_STEPS
from polytrace_cli.cli import app
from polytrace_cli.report import style
from polytrace_cli.report.figures import f02_response_by_step, f05_step_time, f06_rank_imbalance
from polytrace_cli.report.help import build_help
from polytrace_cli.report.writer import build_report, summary_document
from polytrace_cli.store import open_store
from test_report import _insert_samples

runner = CliRunner()


def _console_log(path: Path, step_seconds: list[float], testing: dict[int, float]) -> None:
    """A verl console log with the given step times (steps 1..n) and validation seconds at some steps."""
    lines = []
    for step, seconds in enumerate(step_seconds, 1):
        extra = f" - timing_s/testing:{testing[step]}" if step in testing else ""
        lines.append(f"(TaskRunner pid=1) step:{step} - timing_s/gen:{seconds / 2} - timing_s/update_actor:2.0"
                     f"{extra} - timing_s/step:{seconds} - response_length/mean:500 - response_length/max:900")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def mixed_report(tmp_path_factory) -> Path:
    """Run a: two ranks; run b: one rank (no imbalance); run c: a console log with validation at steps 3, 6."""
    folder = tmp_path_factory.mktemp("mixed")
    db = folder / "store.duckdb"
    _console_log(folder / "logs" / "c" / "train.log", [20.0, 20.0, 40.0, 20.0, 20.0, 40.0], {3: 10.0, 6: 10.0})
    result = runner.invoke(app, ["ingest", str(folder / "logs" / "c"), "--run", "c", "--db", str(db)])
    assert result.exit_code == 0, result.output
    con = open_store(db)
    try:
        # a: step 0 rank 0 loads 10+90 + 10+110 = 220 (longest 110), rank 1 20+180 + 20+200 = 420 (longest 200).
        _insert_samples(con, "a", "math", [(0, 0, 0, 10, 90), (0, 0, 1, 10, 110), (0, 1, 2, 20, 180),
                                           (0, 1, 3, 20, 200)])
        _insert_samples(con, "b", "code", [(0, 0, 0, 50, 100), (0, 0, 1, 50, 100), (5, 0, 0, 50, 300)])
    finally:
        con.close()
    result = runner.invoke(app, ["report", "--db", str(db), "--out", str(folder / "r"), "--name", "mixed", "--svg"])
    assert result.exit_code == 0, result.output
    return folder / "r" / "mixed" / "index.html"


def test_page_opens_with_findings_then_what_would_help(mixed_report):
    html = mixed_report.read_text()
    body = html[html.index("<body>"):]
    headings = re.findall(r"<h([12])[^>]*>(.*?)</h\1>", body)
    assert headings[0][0] == "1" and headings[1][1] == "Findings" and headings[2][1] == "What would help"
    # Before Findings: only the title.
    assert not re.search(r"<(p|table|figure|img)\b", body[:body.index("Findings")])
    markdown = (mixed_report.parent / "summary.md").read_text()
    sections = re.findall(r"^## (.*)$", markdown, flags=re.M)
    assert sections[:2] == ["Findings", "What would help"]


def test_findings_numbers_by_hand(mixed_report):
    summary = json.loads((mixed_report.parent / "summary.json").read_text())
    findings = summary["findings"]
    assert findings and all(set(f) == {"run", "cause", "seconds", "share", "steps", "text", "on_page"}
                            for f in findings)
    by = {(f["run"], f["cause"]): f for f in findings}
    # c: validation 10 + 10 s of 160 s of step time, in 2 of 6 steps. The step timer includes it: at steps 3
    # and 6 step − stages = 40 − 22 = 18 = the other steps' 20 − 12 plus the 10 s of validation.
    validation = by[("c", "validation")]
    assert validation["seconds"] == pytest.approx(20.0) and validation["share"] == pytest.approx(20 / 160)
    assert validation["steps"] == 2 and "12.5% of step time" in validation["text"]
    # c: the largest stage is gen, Σ gen / Σ step = 80 / 160.
    assert by[("c", "stage:gen")]["share"] == pytest.approx(0.5)
    # a: slot idle = mean over ranks of 1 − mean/max: rank 0 1 − 100/110, rank 1 1 − 190/200.
    assert by[("a", "slot-idle")]["share"] == pytest.approx(((1 - 100 / 110) + (1 - 190 / 200)) / 2)
    # a: the rollout waits for the longest response: makespan λ = 200 / 155, idle 1 − 155/200.
    assert by[("a", "dp-idle")]["share"] == pytest.approx(1 - 155 / 200)
    assert "makespan λ 1.29" in by[("a", "dp-idle")]["text"]
    # Run by run, in report order, the costs ranked by share.
    assert list(dict.fromkeys(f["run"] for f in findings)) == summary["runs"]
    for run in summary["runs"]:
        shares = [f["share"] for f in findings if f["run"] == run and f["share"] is not None]
        assert shares == sorted(shares, reverse=True)
    html = mixed_report.read_text()
    assert "Findings" in html and validation["text"].removeprefix("c: ").capitalize()[:40] in html


def test_validation_outside_the_step_timer_is_a_share_of_step_plus_validation(tmp_path):
    """A run whose step time does not count validation (step − stages is the same 8 s with or without it):
    validation's share is 10 / (Σ step + 10), and nothing is assumed."""
    from polytrace_cli.report.findings import build_findings

    db = tmp_path / "store.duckdb"
    _console_log(tmp_path / "logs" / "x" / "train.log", [20.0] * 6, {3: 10.0})
    assert runner.invoke(app, ["ingest", str(tmp_path / "logs" / "x"), "--run", "x", "--db", str(db)]).exit_code == 0
    con = open_store(db)
    try:
        run_ids = [row[0] for row in con.execute("SELECT run_id FROM runs").fetchall()]
        findings = build_findings(con, run_ids, ALL_STEPS, {})
    finally:
        con.close()
    validation = next(f for f in findings if f["cause"] == "validation")
    assert validation["share"] == pytest.approx(10 / 130) and validation["steps"] == 1
    assert "assuming" not in validation["text"]


def test_findings_say_what_could_not_be_measured(tmp_path):
    con = open_store(tmp_path / "store.duckdb")
    try:
        run = con.execute("INSERT INTO runs (run_id, name) VALUES (nextval('run_id_seq'), 'bare') RETURNING run_id"
                          ).fetchall()[0][0]
        report = build_report(con, [run], tmp_path / "out", None, ALL_STEPS)
    finally:
        con.close()
    assert [f["cause"] for f in report.findings] == ["not-measured"]
    assert "bare: no time sink could be measured" in report.findings[0]["text"]
    assert report.help == []


def test_what_would_help_uses_the_quantity_that_sets_the_step_time():
    rows = pl.DataFrame([
        {"run": "rollout", "basis": "samples", "mean_lambda": 1.16, "mean_makespan_lambda": 1.01,
         "mean_lambda_balanced": 1.0, "mean_saving": 0.13, "saving_basis": "makespan",
         "saving_basis_reason": imbalance.MAKESPAN_REASON, "mean_step_saving": 0.0},
        {"run": "console", "basis": "global_seqlen", "mean_lambda": 1.2, "mean_makespan_lambda": None,
         "mean_lambda_balanced": 1.05, "mean_saving": 0.125, "saving_basis": "tokens",
         "saving_basis_reason": imbalance.TOKENS_REASON, "mean_step_saving": 0.125},
    ], schema=imbalance.SUMMARY_COLUMNS, strict=False)
    rollout, console = build_help({"imbalance": rows})
    assert (rollout["basis"], rollout["saving"]) == ("makespan", 0.0)
    assert "save 0.0% of rollout time" in rollout["text"] and "would suggest 13.0%" in rollout["text"]
    assert (console["basis"], console["saving"]) == ("tokens", 0.125)
    assert "by 12.5% (token λ 1.20 → 1.05)" in console["text"]


def test_every_figure_lists_runs_shown_and_left_out(mixed_report):
    summary = json.loads((mixed_report.parent / "summary.json").read_text())
    figures = {f["id"]: f for f in summary["figures"]}
    for figure in figures.values():
        assert set(figure["runs"]) | set(figure["runs_left_out"]) == {"a", "b", "c"}
        assert not set(figure["runs"]) & set(figure["runs_left_out"])
        assert all(figure["runs_left_out"].values())
    # F6: only run a has two ranks; b (one rank) and c (console, no global_seqlen) are named with the reason.
    assert figures["F6"]["runs"] == ["a"]
    assert set(figures["F6"]["runs_left_out"]) == {"b", "c"}
    reason = figures["F6"]["runs_left_out"]["b"]
    html, markdown = mixed_report.read_text(), (mixed_report.parent / "summary.md").read_text()
    assert f"b: {reason}" in html and f"b: {reason}" in markdown
    assert figures["F5"]["runs"] == ["c"] and set(figures["F5"]["runs_left_out"]) == {"a", "b"}
    assert set(figures["F2"]["runs"]) == {"a", "b", "c"}
    # The figure itself names them too: F6's file carries the note (checked in its SVG text).
    svg = (mixed_report.parent / "figures" / figures["F6"]["svg"]).read_text()
    note = re.search(r"Not shown \([^)]*\): ([a-z_, ]+)", svg)
    assert note and set(note.group(1).strip().split(", ")) == {"b", "c"}
    assert "Not shown" not in (mixed_report.parent / "figures" / figures["F2"]["svg"]).read_text()


def test_step_segments_break_at_missing_steps():
    assert style.step_segments([0, 5]) == [slice(0, 1), slice(1, 2)]
    assert style.step_segments([1, 2, 3, 5, 6]) == [slice(0, 3), slice(3, 5)]
    assert style.step_segments([0, 10, 20, 30]) == [slice(0, 4)]  # logged every 10 steps: no gap
    assert style.step_segments([0, 10, 20, 40]) == [slice(0, 3), slice(3, 4)]
    assert style.missing_steps([0, 5]) == 4 and style.missing_steps([0, 10, 20, 40]) == 1


def test_f2_draws_no_line_or_band_across_missing_steps():
    """Steps 0 and 5 only (Search-R1's shape): two separate points, no segment spanning steps 1–4."""
    rows = [{"run": "r", "step": step, "kind": "response", "basis": "samples", "mean_tokens": mean,
             "p50_tokens": mean, "p90_tokens": mean * 1.5, "p99_tokens": mean * 2, "min_tokens": 1.0,
             "max_tokens": mean * 3} for step, mean in [(0, 800.0), (5, 100.0)]]
    figure = f02_response_by_step.render({"per_step": pl.DataFrame(rows)})
    ax = figure.axes[0]
    for line in ax.get_lines():
        xs = np.asarray(line.get_xdata(), dtype=float)
        assert xs.size <= 1 or np.ptp(xs) < 5, f"line {line.get_label()} spans the missing steps"
    for band in ax.collections:
        for path in band.get_paths():
            assert np.ptp(path.vertices[:, 0]) < 5
    assert ax.get_xlabel() == style.WORKLOAD_STEP


def _series(step_seconds: list[float], reasons: dict[int, str]) -> pl.DataFrame:
    median = float(np.median(step_seconds))
    mad = float(np.median(np.abs(np.array(step_seconds) - median)))
    rows = []
    for step, seconds in enumerate(step_seconds):
        z = abs(seconds - median) / (1.4826 * mad)
        rows.append({"run": "r", "segment": 0, "step": step, "step_s": seconds, "gen_s": seconds / 2,
                     "robust_z": z, "reasons": reasons.get(step, ""), "outlier": z > 3.5,
                     "slow_outlier": z > 3.5 and seconds > median})
    return pl.DataFrame(rows)


def test_f5_marks_only_slow_steps_and_names_overheads_apart():
    times = [20.0, 21.0, 19.0, 20.5, 19.5, 20.0, 60.0, 20.2, 2.0, 58.0, 20.1, 19.8]
    figure = f05_step_time.render({"series": _series(times, {6: "testing"})})
    ax = figure.axes[0]
    marked = {label: np.asarray(c.get_offsets()) for c, label in
              zip(ax.collections, [c.get_label() for c in ax.collections])}
    assert marked["slow: validation / checkpoint"][:, 0].tolist() == [6]
    assert marked["slow: anomaly"][:, 0].tolist() == [9]  # step 8 (2 s) is an outlier but fast: not marked
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts[0].startswith("anomaly (z ") and texts[1].startswith("validation (z ")


def test_f5_labels_do_not_overlap():
    times = [20.0 + 0.1 * (step % 5) for step in range(20)]
    for step in (3, 4, 5, 6, 7, 15):  # neighbouring slow steps: their labels would collide if placed naively
        times[step] = 60.0 + step
    figure = f05_step_time.render({"series": _series(times, {})})
    ax = figure.axes[0]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    from matplotlib.text import Text

    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the label text, not its line
    assert 1 <= len(boxes) <= f05_step_time.TOP_LABELS
    for i, first in enumerate(boxes):
        for second in boxes[i + 1:]:
            assert not first.overlaps(second)


def test_f6_console_only_run_has_no_blank_heat_map_and_sampled_run_shows_both_lambdas():
    console = pl.DataFrame([{"run": "console", "segment": 0, "step": s, "ranks": None, "mean_load_tokens": 100.0,
                             "max_load_tokens": 120.0, "max_rank": None, "lambda": 1.2, "idle_share": 1 / 6,
                             "makespan_lambda": None, "lambda_kk": None, "lambda_lpt": None,
                             "lambda_balanced": 1.05, "saving_kk": None, "saving_lpt": None, "saving": 0.125,
                             "basis": "global_seqlen", "saving_basis": "tokens",
                             "saving_basis_reason": imbalance.TOKENS_REASON, "step_saving": 0.125}
                            for s in (1, 2, 3)], schema=imbalance.PER_STEP_COLUMNS)
    figure = f06_rank_imbalance.render({"ranks": pl.DataFrame(schema=imbalance.PER_RANK_COLUMNS), "steps": console})
    assert len(figure.axes) == 1  # the λ panel only: no heat map, no colour bar
    assert [line.get_label() for line in figure.axes[0].get_lines() if not line.get_label().startswith("_")] == \
        ["token λ", "token λ balanced"]
    assert "token λ sets the step time" in figure.axes[0].get_title()
    assert figure.axes[0].get_xlabel() == style.TRAINER_STEP


def test_f6_of_a_sampled_run_draws_makespan_beside_token_lambda(mixed_report):
    summary = json.loads((mixed_report.parent / "summary.json").read_text())
    steps = summary["figure_data"]["F6"]["steps"]
    assert steps[0]["lambda"] == pytest.approx(420 / 320) and steps[0]["makespan_lambda"] == pytest.approx(200 / 155)
    assert steps[0]["saving_basis"] == "makespan" and steps[0]["step_saving"] == 0.0


def test_summary_document_keeps_findings_and_help_shape(tmp_path):
    con = open_store(tmp_path / "store.duckdb")
    try:
        run = _insert_samples(con, "a", "math", [(0, 0, 0, 10, 90), (0, 1, 1, 10, 30)])
        report = build_report(con, [run], tmp_path / "out", None, ALL_STEPS)
    finally:
        con.close()
    document = summary_document(report)
    assert list(document)[:5] == ["report", "runs", "findings", "what_would_help", "what_would_help_note"]
    assert document["what_would_help"][0]["policy"] == "rebalance-dp-ranks"
    assert "polytrace whatif" in document["what_would_help_note"]


def test_series_flags_slow_outliers_only_on_the_slow_side(tmp_path):
    """Step times 20, 21, 19, 20, 21, 19, 20, 60, 2, 20: median 20, MAD 1, so 60 (z 27) and 2 (z 12) are
    outliers, and only 60 is slow."""
    from polytrace_cli.analyze import stages

    times = [20.0, 21.0, 19.0, 20.0, 21.0, 19.0, 20.0, 60.0, 2.0, 20.0]
    _console_log(tmp_path / "logs" / "t" / "train.log", times, {})
    db = tmp_path / "store.duckdb"
    assert runner.invoke(app, ["ingest", str(tmp_path / "logs" / "t"), "--run", "t", "--db", str(db)]).exit_code == 0
    con = open_store(db)
    try:
        series = stages.series(con, [1]).sort("step")
    finally:
        con.close()
    assert series.filter(pl.col("outlier"))["step"].to_list() == [8, 9]
    assert series.filter(pl.col("slow_outlier"))["step"].to_list() == [8]
    assert series.filter(pl.col("step") == 8)["robust_z"].item() == pytest.approx(40 / 1.4826)


INJECTED_STEP = 33


@pytest.fixture(scope="module")
def generated_report(tmp_path_factory) -> tuple[Path, Path]:
    """A generated verl console log (60 steps, validation every 10, response cap 4096) with 2 s of
    unexplained time injected at step 33, ingested as run `verl` and reported."""
    folder = tmp_path_factory.mktemp("generated")
    db = folder / "store.duckdb"
    for args in (["synth", "--task", "math", "--format", "verl-console", "--out", str(folder / "logs"),
                  "--num-steps", "60", "--dp-ranks", "4", "--batch", "16", "--n", "4", "--validate-every", "10",
                  "--max-response-len", "4096", "--seed", "3", "--inject", f"{INJECTED_STEP}:unexplained:2.0"],
                 ["ingest", str(folder / "logs"), "--run", "verl", "--db", str(db)],
                 ["report", "--db", str(db), "--out", str(folder / "r"), "--name", "gen"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    return db, folder / "r" / "gen"


def test_findings_of_a_timed_run_come_from_explain(generated_report):
    _, out = generated_report
    findings = [f for f in json.loads((out / "summary.json").read_text())["findings"] if f["run"] == "verl"]
    explained = [f for f in findings if "at_steps" in f]
    # explain's findings, ranked by seconds among the run's costs, with its cause words and `steps` the count
    # of `at_steps`.
    assert explained
    seconds = [f["seconds"] for f in explained]
    assert seconds == sorted(seconds, reverse=True)
    assert all(f["steps"] == len(f["at_steps"]) for f in explained)
    by_cause = {f["cause"]: f for f in explained}
    assert by_cause["unexplained"]["at_steps"] == [INJECTED_STEP]
    assert by_cause["validation"]["at_steps"] == [10, 20, 30, 40, 50, 60]
    # The analyses' entries explain covers are gone; the ones it does not cover (and the largest stage) stay.
    rest = {f["cause"] for f in findings if "at_steps" not in f}
    assert rest <= {"slot-idle", "dapo-discarded", "not-measured", "stage:gen"} and {"slot-idle", "stage:gen"} <= rest
    assert not {"dp-idle", "checkpoint"} & {f["cause"] for f in findings}
    costs = [f for f in findings if f["cause"] != "not-measured"]
    shares = [f["share"] for f in costs]
    assert shares == sorted(shares, reverse=True)
    # The page shows the first SHOWN costs of at least 0.5% of the run; the rest are in summary.json only.
    from polytrace_cli.report.findings import SHOWN

    assert [f["on_page"] for f in costs] == [f["share"] >= 0.005 and i < SHOWN for i, f in enumerate(costs)]
    shown, hidden = [f for f in costs if f["on_page"]], [f for f in costs if not f["on_page"]]
    assert shown and hidden and by_cause["validation"]["on_page"] and not by_cause["dp_imbalance"]["on_page"]
    html, markdown = (out / "index.html").read_text(), (out / "summary.md").read_text()
    from html import escape

    from polytrace_cli.report.markdown import md_text

    for page, written in ((html, escape), (markdown, md_text)):
        assert all(written(f["text"].removeprefix("verl: ")[1:]) in page for f in shown)
        assert all(written(f["text"].removeprefix("verl: ")[1:]) not in page for f in hidden)
        assert f"{len(hidden)} smaller finding" in page and "in summary.json" in page


def test_a_failing_explain_keeps_the_analyses_findings_and_says_why(generated_report, monkeypatch):
    from polytrace_cli import diagnose
    from polytrace_cli.report.findings import build_findings

    def broken(con, run, step=None, top=None):
        raise ValueError("model blew up")

    monkeypatch.setattr(diagnose, "explain_run", broken)
    db, _ = generated_report
    con = open_store(db)
    try:
        findings = build_findings(con, [1], ALL_STEPS, {})
    finally:
        con.close()
    causes = [f["cause"] for f in findings]
    assert "validation" in causes and "not-modelled" in causes and all("at_steps" not in f for f in findings)
    note = next(f for f in findings if f["cause"] == "not-modelled")
    assert note["text"] == "verl: the step-time explanation failed (ValueError: model blew up); its findings are the analyses'."


def test_what_would_help_a_timed_run_comes_from_the_step_time_model(generated_report):
    from polytrace_cli.analyze import stages

    db, out = generated_report
    summary = json.loads((out / "summary.json").read_text())
    entries = [h for h in summary["what_would_help"] if h["run"] == "verl"]
    policies = [h["policy"] for h in entries]
    # The parameters come from the data: validation every 10 steps takes ~10% of the run, so every 50
    # (at 50 and the last step, 60) brings it to 2 of the 6 validations; one-step-off at the share of GPUs
    # the stage times favour. Responses sit at the 4096 cap on more than 5% of them: no cap is proposed.
    assert {"balance", "no-validation", "partial-rollout=0.9", "validate-every=50"} < set(policies)
    split = next(p for p in policies if p.startswith("one-step-off="))
    assert float(split.split("=")[1]) in (0.25, 0.375, 0.5, 0.625, 0.75) and len(policies) == 5
    validate = next(h for h in entries if h["policy"] == "validate-every=50")
    assert "every 10 steps" in validate["why"] and "(2 times)" in validate["why"]
    one_step_off = next(h for h in entries if h["policy"] == split)
    assert "lowest predicted wall time" in one_step_off["why"] and one_step_off["saving_s"] > 0
    assert "rebalance-dp-ranks" not in policies
    priced = [h["saving_s"] for h in entries if h["saving_s"] is not None]
    assert priced == sorted(priced, reverse=True)
    assert entries[:len(priced)] == [h for h in entries if h["saving_s"] is not None]
    for entry in entries:
        assert entry["assumption"] and entry["backtest"]["accuracy"] is not None
        if entry["saving_s"] is None:  # not priced: the note says why, no number
            assert entry["reason"] and "no estimate" in entry["text"] and " would save" not in entry["text"]
    # no-validation removes exactly the logged testing seconds, which this run's step time includes.
    con = open_store(db)
    try:
        inclusion = stages.step_time_inclusion(con, [1])
        testing = stages.per_step(con, [1], ALL_STEPS)["testing_s"].fill_null(0).sum()
    finally:
        con.close()
    assert inclusion["includes_testing"].to_list() == [True]
    no_validation = next(h for h in entries if h["policy"] == "no-validation")
    assert testing > 0 and no_validation["saving_s"] == pytest.approx(testing, rel=1e-9)
    # The backtest is beside the list, flagged only when the model is worse than the better baseline.
    backtest = entries[0]["backtest"]
    assert backtest["flagged"] == (backtest["accuracy"] < max(backtest["median_baseline"], backtest["recent_baseline"]))
    line = f"held-out step times {backtest['accuracy']:.1f}% accurately"
    html, markdown = (out / "index.html").read_text(), (out / "summary.md").read_text()
    assert line in html and line in markdown
    # One row per policy saving at least 0.5% of the run: policy | saving (s and %) | ± | how sure | why, the
    # assumption folded under it; exact from the log for no-validation.
    assert no_validation["certainty"] == "exact" and no_validation["on_page"]
    minutes = f"{no_validation['saving_s'] / 60:.1f} min ({100 * no_validation['saving']:.1f}%)"
    assert f"| no-validation | {minutes} | 0 | exact | drop the logged validation |" in markdown
    assert f"<td>no-validation</td><td>{minutes}</td><td>0</td><td>exact</td>" in html
    assert f"<summary>assumptions</summary>Assumes {no_validation['assumption']}." in html
    for index, entry in enumerate(entries):  # the four largest savings of at least 0.5% of the run
        assert entry["on_page"] == (entry["saving"] is not None and entry["saving"] >= 0.005 and index < 4)
        if not entry["on_page"]:  # named in the folded line, never a row of the table
            assert f"<td>{entry['policy']}</td>" not in html and entry["policy"] in html


def test_every_policy_has_its_note_under_its_name():
    from polytrace_cli.report.help import POLICY_NOTES
    from polytrace_cli.simulate.policies import POLICIES

    assert set(POLICY_NOTES) == set(POLICIES)
    # explain's levers and the report's table hold their savings to one threshold.
    from polytrace_cli.report.help import ON_PAGE_SAVING
    from polytrace_cli.simulate.advice import MIN_LEVER_SHARE

    assert MIN_LEVER_SHARE == ON_PAGE_SAVING
    assert {note.certainty for note in POLICY_NOTES.values()} == {"exact", "model", "assumption-bound"}


def test_backtest_below_a_baseline_is_flagged():
    from polytrace_cli.report.help import backtest_sentence

    worse = backtest_sentence("r", {"accuracy": 80.0, "median_baseline": 90.0, "recent_baseline": 85.0,
                                    "flagged": True, "reason": None})
    assert worse == ("r: the step-time model predicts held-out step times 80.0% accurately (median baseline 90.0%, "
                     "recent baseline 85.0%): worse than a baseline, so these predictions are doubtful.")
    better = backtest_sentence("r", {"accuracy": 95.0, "median_baseline": 90.0, "flagged": False, "reason": None})
    assert better == "r: the step-time model predicts held-out step times 95.0% accurately (median baseline 90.0%)."


def test_a_failing_whatif_keeps_the_rebalancing_counterfactual_and_says_why(generated_report, monkeypatch):
    from polytrace_cli import simulate

    def broken(con, run, policies):
        raise ValueError("fit blew up")

    monkeypatch.setattr(simulate, "whatif_run", broken)
    db, _ = generated_report
    con = open_store(db)
    try:
        entries = build_help({}, con, [1])
    finally:
        con.close()
    assert [(e["policy"], e["text"]) for e in entries] == [
        ("not-modelled", "verl: the step-time model's predictions failed (ValueError: fit blew up).")]


def top_words(index: Path) -> int:
    """The words of the page's top section (findings and what would help) a person sees without opening a
    folded line: each <details> counts its summary only."""
    import html as html_text

    page = index.read_text()
    top = re.search(r"<section id='top'>(.*?)</section>", page, flags=re.S).group(1)
    top = re.sub(r"<details[^>]*>\s*<summary>(.*?)</summary>.*?</details>", r" \1 ", top, flags=re.S)
    return len(html_text.unescape(re.sub(r"<[^>]+>", " ", top)).split())


def test_the_top_of_the_page_stays_within_its_word_budget(mixed_report, generated_report):
    from polytrace_cli.report.top import TOP_WORDS_PER_RUN

    for index in (mixed_report, generated_report[1] / "index.html"):
        runs = json.loads((index.parent / "summary.json").read_text())["runs"]
        assert 0 < top_words(index) <= TOP_WORDS_PER_RUN * len(runs), index
