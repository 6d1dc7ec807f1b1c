"""What a person meets at the command line: every usage error is one line with exit 2 (through one handler,
with the nearest option or command), and tables that cut columns keep the ones that carry the answer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.commands import common

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize(("args", "line"), [
    (("steps", "r", "--step", "5"), "error: --step is not an option of steps; did you mean --steps?"),
    (("errors", "--run", "x"), "error: --run is not an option of errors; RUN is an argument: polytrace errors RUN"),
    (("report", "--svgg"), "error: --svgg is not an option of report; did you mean --svg?"),
    (("stpes",), "error: stpes is not a polytrace command; did you mean steps?"),
    (("steps",), "error: missing argument 'RUN' (polytrace steps -h for help)"),
    (("explain", "r", "--top", "y"),
     "error: invalid value for '--top': 'y' is not a valid int (polytrace explain -h for help)"),
    (("formats", "--widest"), "error: --widest is not an option of formats; did you mean --wide?"),
])
def test_every_usage_error_is_one_line_and_exit_2(args, line):
    result = _invoke(*args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [line]


def test_help_and_no_arguments_still_print_help():
    assert _invoke("steps", "-h").exit_code == 0 and "--steps" in _invoke("steps", "-h").output
    bare = runner.invoke(app, [])
    assert "Usage" in bare.output and "steps" in bare.output


@pytest.fixture
def narrow(monkeypatch):
    """The command line's console at 110 columns, as a terminal of that width would give it."""
    monkeypatch.setattr(common.console, "width", 110)


def test_formats_wraps_its_descriptions_instead_of_cutting_them(narrow):
    from polytrace_cli.ingest.sniffing import all_ingesters

    table = _invoke("formats").output
    assert "…" not in table and max(len(line) for line in table.splitlines()) <= 110
    flat = " ".join(part.strip() for line in table.splitlines() for part in line.split("│")[3:4])
    for ingester in all_ingesters():
        assert " ".join(ingester.description.split()) in " ".join(flat.split())


def test_errors_at_110_columns_keeps_the_reason_and_names_what_it_hid(tmp_path, narrow):
    folder = tmp_path / "a" / "long" / "folder" / "name" / "run"
    folder.mkdir(parents=True)
    (folder / "packed_lengths_step_0.jsonl").write_text(
        '{"step": 0, "rank": 0, "dp_rank": 0, "tp_rank": 0, "local_index": 0, "input": 10, "output": [5, 6]}\n'
        "this line is not JSON, and it is long enough that its raw text would fill the table\n")
    db = tmp_path / "s.duckdb"
    assert _invoke("ingest", tmp_path / "a", "--db", db).exit_code == 0
    table = _invoke("errors", "--db", db).output
    header = table.splitlines()[2]
    assert "reason" in header and "line" in header and "file" in header
    assert "not JSON" in table and "more column(s) with --wide or --json: " in table
    assert "raw" in table.splitlines()[-1]


def test_fidelity_at_110_columns_keeps_pass(tmp_path, narrow):
    rng = np.random.default_rng(5)
    folder = tmp_path / "lab"
    folder.mkdir()
    for step in range(2):
        lines = [json.dumps({"step": step, "rank": g % 2, "dp_rank": g % 2, "tp_rank": 0, "local_index": g // 2,
                             "input": 100, "output": [int(x) for x in rng.lognormal(np.log(500), 0.5, 4)],
                             "n_sampling": 4, "validate": False}) for g in range(8)]
        (folder / f"packed_lengths_step_{step}.jsonl").write_text("\n".join(lines) + "\n")
    db = tmp_path / "s.duckdb"
    assert _invoke("ingest", folder, "--db", db, "--run", "lab").exit_code == 0
    result = _invoke("fidelity", "lab", "--db", db, "--sampler", "parametric")
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "sampler" in line)
    assert "pass" in header and "ks" in header
    hidden = [line for line in result.output.splitlines() if "more column(s)" in line]
    assert hidden and "pass" not in hidden[0]
