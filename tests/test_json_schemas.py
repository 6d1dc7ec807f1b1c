"""Every `--json` output and a report's summary.json validate against their JSON Schema in `schemas/`,
on the sample logs (three generated PolyTrace runs and a generated verl console log) plus a line that
cannot be read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import typer.main
from typer.testing import CliRunner

import schema_check
from conftest import PROJECT_ROOT
from polytrace_cli.cli import COMMANDS, app
from polytrace_cli.schemas import JSON_SCHEMA_VERSION, json_schema, json_schema_commands

SAMPLE_LOGS = PROJECT_ROOT / "sample_logs"
runner = CliRunner()


def assert_valid(document: object, command: str) -> None:
    """`document` satisfies `schemas/<command>.schema.json`."""
    schema_check.validate(document, json_schema(command), cls=jsonschema.Draft202012Validator)


def _json(*args) -> object:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    if not (SAMPLE_LOGS / "math-verl").exists():
        pytest.skip("sample_logs/ not generated (polytrace demo)")
    folder = tmp_path_factory.mktemp("contracts")
    for run in ("math", "math-verl"):
        shutil.copytree(SAMPLE_LOGS / run, folder / run)
    # One line that cannot be read, so `errors --json` has a row to describe.
    with (folder / "math" / "packed_lengths_step_0.jsonl").open("a") as file:
        file.write("{not json\n")
    return folder


@pytest.fixture(scope="module")
def db(logs) -> Path:
    path = logs / "store.duckdb"
    assert_valid(_json("ingest", logs / "math", logs / "math-verl", "--db", path, "--json"), "ingest")
    return path


def test_every_schema_is_a_valid_draft_2020_12_schema_with_a_versioned_id():
    for command in json_schema_commands():
        schema = json_schema(command)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"] == f"urn:polytrace:schema:{command}:v{JSON_SCHEMA_VERSION}"


def test_every_command_with_json_output_has_a_schema():
    with_json = {name for name, function in COMMANDS.items()
                 if any("--json" in (param.opts or []) for param in typer.main.get_command(app).commands[name].params)}
    assert with_json, "no command has --json: the introspection is broken"
    assert with_json - set(json_schema_commands()) == set()


def test_store_commands(db):
    assert_valid(_json("runs", "--db", db, "--json"), "runs")
    assert_valid(_json("formats", "--json"), "formats")
    assert_valid(_json("query", "SELECT run_id, name FROM runs", "--db", db, "--json"), "query")
    errors = _json("errors", "--db", db, "--json")
    assert len(errors) == 1
    assert_valid(errors, "errors")
    assert_valid(_json("lake", db.parent / "lake", "--db", db, "--json"), "lake")


def test_analysis_commands(db):
    analyze = _json("analyze", "--db", db, "--json")
    assert analyze["lengths"] and analyze["stages"]
    assert_valid(analyze, "analyze")
    assert_valid(_json("compare", "math", "math-verl", "--db", db, "--json"), "compare")
    assert_valid(_json("steps", "math-verl", "--steps", "1:20", "--db", db, "--json"), "steps")
    assert_valid(_json("check", "math-verl", "--max-step-cv", "5", "--db", db, "--json"), "check")


def test_model_commands(db):
    assert_valid(_json("explain", "math-verl", "--db", db, "--json"), "explain")
    policy = _json("whatif", "math-verl", "--policy", "balance", "--db", db, "--json")
    backtest = _json("whatif", "math-verl", "--backtest", "--db", db, "--json")
    assert_valid(policy, "whatif")
    assert_valid(backtest, "whatif")
    # The two shapes are told apart: a backtest is not a valid policy document.
    policies_only = {**json_schema("whatif"), "oneOf": [{"$ref": "#/$defs/policies"}]}
    with pytest.raises(jsonschema.ValidationError):
        schema_check.validate(backtest, policies_only, cls=jsonschema.Draft202012Validator)


def test_workload_commands(db, logs):
    assert_valid(_json("fit", "math", "--out", logs / "params", "--db", db, "--json"), "fit")
    assert_valid(_json("fidelity", "math", "--sampler", "parametric", "--db", db, "--json"), "fidelity")
    shutil.copytree(logs / "math-verl", logs / "replay")
    assert_valid(_json("replay-check", "--benchmark", logs / "replay" / "train.log",
                       "--formal", logs / "math-verl" / "train.log", "--db", logs / "replay.duckdb", "--json"),
                 "replay-check")
    assert_valid(_json("rm", "math", "--db", db, "--json"), "rm")


def test_a_schema_rejects_a_document_that_breaks_it():
    with pytest.raises(jsonschema.ValidationError):
        assert_valid({"run": "a", "passed": "yes", "checks": []}, "check")
    with pytest.raises(jsonschema.ValidationError):
        assert_valid([{"format": "x"}], "formats")
