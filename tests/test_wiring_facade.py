"""`Store.steps`, `Store.explain` and `Store.whatif`, used as a notebook would, checked against the
command line's JSON on a generated verl console log with causes injected at known steps."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from polytrace_cli import Store
from polytrace_cli.cli import app
from polytrace_cli.errors import PolytraceError
from polytrace_cli.jsontext import json_default

runner = CliRunner()
POLICIES = ["balance", "no-validation", "max-response-len=2048"]


def _cli_json(*args) -> object:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _as_cli(document: object) -> object:
    """A Python document as the command line writes it (json_default for dates and numpy values)."""
    return json.loads(json.dumps(document, default=json_default))


@pytest.fixture(scope="module")
def verl_log(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wiring_facade")
    result = runner.invoke(app, [str(a) for a in (
        "synth", "--task", "math", "--format", "verl-console", "--out", tmp / "logs", "--num-steps", 60,
        "--batch", 32, "--n", 4, "--dp-ranks", 4, "--max-response-len", 4096, "--seed", 11,
        "--validate-every", 15, "--inject", "37:unexplained:2.0")])
    assert result.exit_code == 0, result.output
    return tmp / "logs"


def test_notebook_steps_explain_whatif_match_the_command_line(verl_log, tmp_path):
    db = tmp_path / "nb.duckdb"
    with Store.open(db) as store:
        store.ingest(verl_log, run="verl")
        steps = store.steps("verl")
        late = store.steps("verl", steps="40:")
        explanation = store.explain("verl")
        one_step = store.explain("verl", step=37)
        top = store.explain("verl", top=2)
        whatif = store.whatif("verl", POLICIES)
        single = store.whatif("verl", "no-validation")
        backtest = store.whatif("verl", backtest=True)

    # What the notebook sees, by itself.
    assert steps.height == 61 and late["step"].to_list() == list(range(40, 61))
    assert steps.filter(steps["step"] == 37)["top_cause"].to_list() == ["unexplained"]
    assert explanation.basis == "seconds" and 37 in [row["step"] for row in explanation.steps]
    assert [row["step"] for row in one_step.steps] == [37]
    assert len(top.findings) <= 2 and len(top.steps) <= 2
    assert [s.policy for s in whatif.scenarios] == POLICIES
    testing = steps["testing_s"].sum()
    assert single.scenarios[0].saving_s == pytest.approx(testing, rel=1e-9)

    # The same documents from the command line, once the notebook closed the store.
    assert _cli_json("steps", "verl", "--json", "--db", db) == _as_cli(steps.to_dicts())
    assert _cli_json("steps", "verl", "--steps", "40:", "--json", "--db", db) == _as_cli(late.to_dicts())
    assert _cli_json("explain", "verl", "--json", "--db", db) == json.loads(explanation.to_json())
    assert _cli_json("explain", "verl", "--step", 37, "--json", "--db", db) == json.loads(one_step.to_json())
    assert _cli_json("explain", "verl", "--top", 2, "--json", "--db", db) == json.loads(top.to_json())
    policy_args = [arg for policy in POLICIES for arg in ("--policy", policy)]
    assert _cli_json("whatif", "verl", *policy_args, "--json", "--db", db) == json.loads(whatif.to_json()) == _as_cli(whatif.to_dict())
    assert _cli_json("whatif", "verl", "--backtest", "--json", "--db", db) == json.loads(backtest.to_json()) == _as_cli(backtest.to_dict())


def test_mistakes_are_polytrace_errors(verl_log, tmp_path):
    with Store.open(tmp_path / "s.duckdb") as store:
        store.ingest(verl_log, run="verl")
        with pytest.raises(PolytraceError, match="either backtest=True or at least one policy"):
            store.whatif("verl")
        with pytest.raises(PolytraceError, match="either backtest=True or at least one policy"):
            store.whatif("verl", ["balance"], backtest=True)
        with pytest.raises(PolytraceError):
            store.whatif("verl", ["nonsense-policy"])
        with pytest.raises(PolytraceError, match="no run named"):
            store.steps("other")
        with pytest.raises(PolytraceError, match="has no step 999"):
            store.explain("verl", step=999)
