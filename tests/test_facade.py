"""The Python interface, used as a notebook would, checked against the command line's JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from polytrace_cli import Store
from polytrace_cli.analyze.common import StepRange
from polytrace_cli.analyze.results import results_json
from polytrace_cli.cli import app
from polytrace_cli.errors import PolytraceError

runner = CliRunner()
STEPS, BATCH, N = 4, 16, 4


def _cli_json(*args) -> object:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def traces(tmp_path):
    """Two generated runs: packed lengths (math) and multi-turn trajectories with tool calls (search)."""
    for task, extra in (("math", []), ("search", ["--multiturn"])):
        result = runner.invoke(app, ["synth", "--task", task, "--out", str(tmp_path / task), "--num-steps", STEPS,
                                     "--batch", BATCH, "--n", N, "--dp-ranks", 2, "--seed", 3, *extra])
        assert result.exit_code == 0, result.output
    return tmp_path


def test_notebook_session_matches_the_command_line(traces, tmp_path, monkeypatch):
    db = tmp_path / "nb.duckdb"
    monkeypatch.setenv("POLYTRACE_DB", str(db))  # Store.open() with no path finds it as the CLI does
    with Store.open() as store:
        assert store.path == db
        reports = store.ingest(traces / "math", run="math", task="math")
        reports += store.ingest([traces / "search"], run="search", task="search")
        assert {r.status for r in reports} == {"ingested"}
        assert sum(r.rejected for r in reports) == 0

        runs = store.runs()
        lengths = store.analyze("lengths")
        lengths_late = store.analyze("lengths", runs="math", steps="2:3")
        assert lengths_late.equals(store.analyze("lengths", runs=["math"], steps=StepRange(2, 3)))
        tools = store.analyze("tools", runs=["search"])
        counted = store.query("SELECT count(*) AS n, avg(response_len) AS mean FROM samples "
                              "JOIN runs USING (run_id) WHERE name = 'math'")
        index = store.report(runs=["math"], out=tmp_path / "reports", name="nb")
        with_svg = store.report(runs=["math"], out=tmp_path / "reports", name="nb_svg", svg=True)

    # Generated truth: every step holds BATCH prompts × N responses.
    math_row = runs.filter(runs["run"] == "math").to_dicts()[0]
    assert (math_row["samples"], math_row["steps"], math_row["task"]) == (STEPS * BATCH * N, STEPS, "math")
    response = lengths.filter((lengths["run"] == "math") & (lengths["kind"] == "response")).to_dicts()[0]
    assert response["count"] == counted["n"][0] == STEPS * BATCH * N
    assert response["mean_tokens"] == pytest.approx(counted["mean"][0])
    late = lengths_late.filter(lengths_late["kind"] == "response").to_dicts()[0]
    assert late["count"] == 2 * BATCH * N
    assert tools.height > 0 and set(tools["run"]) == {"search"}
    assert index == tmp_path / "reports" / "nb" / "index.html" and index.stat().st_size > 0
    pngs = sorted(p.stem for p in (index.parent / "figures").glob("*.png"))
    assert pngs and not list((index.parent / "figures").glob("*.svg"))
    assert sorted(p.stem for p in (with_svg.parent / "figures").glob("*.svg")) == pngs

    # The same numbers from the command line, on the same store once the notebook closed it.
    assert _cli_json("runs", "--json", "--db", db) == json.loads(runs.write_json())
    cli_all = _cli_json("analyze", "--json", "--db", db)
    assert cli_all["lengths"] == json.loads(results_json({"lengths": lengths}))["lengths"]
    cli_late = _cli_json("analyze", "math", "--only", "lengths", "--steps", "2:3", "--json", "--db", db)
    assert cli_late["lengths"] == json.loads(results_json({"lengths": lengths_late}))["lengths"]
    cli_tools = _cli_json("analyze", "search", "--only", "tools", "--json", "--db", db)
    assert cli_tools["tools"] == json.loads(results_json({"tools": tools}))["tools"]


def test_query_is_read_only_and_mistakes_are_polytrace_errors(traces, tmp_path):
    store = Store.open(tmp_path / "s.duckdb")
    store.ingest(traces / "math", run="math")
    with pytest.raises(PolytraceError, match="read-only"):
        store.query("DELETE FROM runs")
    assert store.query("SELECT count(*) AS n FROM runs")["n"][0] == 1
    with pytest.raises(PolytraceError, match="unknown analysis"):
        store.analyze("nonsense")
    with pytest.raises(PolytraceError, match="no run named"):
        store.analyze("lengths", runs="other")
    with pytest.raises(PolytraceError, match="--steps takes"):
        store.analyze("lengths", steps="a:b")
    store.close()
    store.close()
    with pytest.raises(PolytraceError, match="closed"):
        store.runs()
    with Store.open(tmp_path / "s.duckdb", read_only=True) as reader:
        assert reader.runs()["run"].to_list() == ["math"]
        with pytest.raises(PolytraceError, match="read-only"):
            reader.ingest(traces / "math")


def test_importing_the_package_and_the_facade_loads_nothing_heavy():
    probe = ("import sys; from polytrace_cli import Store; "
             "print(sorted(m for m in ('duckdb', 'polars', 'pyarrow', 'scipy', 'matplotlib', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
