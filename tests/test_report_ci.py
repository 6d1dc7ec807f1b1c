"""The CI recipe (examples/ci/polytrace-report.yml) runs as written: its polytrace steps, executed by bash
with the workflow's environment, ingest logs, write the report folder the artifact step uploads, and gate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from conftest import PROJECT_ROOT
from polytrace_cli.cli import app

WORKFLOW = PROJECT_ROOT / "examples" / "ci" / "polytrace-report.yml"
runner = CliRunner()


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps() -> list[dict]:
    (job,) = workflow()["jobs"].values()
    return job["steps"]


def polytrace_steps() -> dict[str, str]:
    """Step name -> its shell script, for the steps that run polytrace."""
    return {s["name"]: s["run"] for s in steps() if "run" in s and re.search(r"^\s*polytrace ", s["run"], re.M)}


def test_workflow_shape():
    data = workflow()
    triggers = data.get("on", data.get(True))  # YAML 1.1 reads the bare key `on` as true
    assert "workflow_dispatch" in triggers
    names = [s.get("name", s.get("uses")) for s in steps()]
    assert names.index("Write the report") < names.index("Keep the report as an artifact") < names.index(
        "Gate on the thresholds")
    upload = next(s for s in steps() if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()", "the report must be kept even when the gate fails"
    assert upload["with"]["path"] == "reports/${{ env.RUN_NAME }}/"
    for script in polytrace_steps().values():
        assert "${{" not in script, "run scripts read the environment, not workflow expressions"


def test_every_option_in_the_recipe_exists():
    """Each `polytrace SUBCOMMAND --option` of the recipe is accepted by that subcommand."""
    for script in polytrace_steps().values():
        words = script.split()
        command = words[words.index("polytrace") + 1]
        helped = runner.invoke(app, [command, "--help"], terminal_width=200)
        assert helped.exit_code == 0, f"polytrace {command} does not exist"
        for option in (w for w in words if w.startswith("--")):
            assert option in helped.output, f"polytrace {command} has no {option}"


def test_recipe_steps_run_against_generated_logs(tmp_path):
    """Run the recipe's polytrace steps in order on a generated code workload, as the runner would."""
    logs = tmp_path / "logs"
    made = runner.invoke(app, ["synth", "--task", "code", "--num-steps", "3", "--batch", "8", "--out", str(logs),
                               "--seed", "5"])
    assert made.exit_code == 0, made.output
    env = os.environ | {
        "LOGS_DIR": str(logs), "RUN_NAME": workflow()["env"]["RUN_NAME"], "POLYTRACE_DB": "polytrace.duckdb",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    results = {}
    for name, script in polytrace_steps().items():
        results[name] = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                                       text=True, timeout=600)
    for name in ("Ingest the logs", "Write the report"):
        assert results[name].returncode == 0, results[name].stderr
    run = env["RUN_NAME"]
    index = tmp_path / "reports" / run / "index.html"
    assert results["Write the report"].stdout.strip() == str(Path("reports") / run / "index.html")
    assert index.exists() and (index.parent / "summary.json").exists()
    gate = results["Gate on the thresholds"]
    assert gate.returncode in (0, 1), gate.stderr
    for option in re.findall(r"--[a-z0-9-]+", polytrace_steps()["Gate on the thresholds"]):
        assert option in gate.stdout
    assert ("check passed" in gate.stdout) == (gate.returncode == 0)


def test_gate_fails_the_step_when_a_threshold_is_exceeded(tmp_path):
    """The same check with an impossible limit exits 1, which fails a GitHub Actions step."""
    logs = tmp_path / "logs"
    assert runner.invoke(app, ["synth", "--task", "code", "--num-steps", "2", "--batch", "8", "--out", str(logs),
                               "--seed", "5"]).exit_code == 0
    db = str(tmp_path / "s.duckdb")
    assert runner.invoke(app, ["ingest", str(logs), "--run", "train", "--db", db]).exit_code == 0
    result = runner.invoke(app, ["check", "train", "--db", db, "--max-imbalance", "1.0", "--max-p99-p50", "1.0"])
    assert result.exit_code == 1 and "check failed" in result.output


def test_the_recipe_gates_a_run_against_the_baseline_recorded_on_main(tmp_path):
    """On main the run is recorded as a lake; on a branch, a run whose generation is 5% slower at the same
    workload (about 3.4% of its step) fails the baseline gate (a run whose responses are only longer passes
    it: tests/test_verdicts.py)."""
    import dataclasses

    from polytrace_cli.workload.presets import preset
    from polytrace_cli.workload.steplog import StepTimeModel, write_step_log
    from polytrace_cli.workload.synth import WorkloadSpec

    scripts = polytrace_steps()
    lengths, _ = preset("math")
    spec = WorkloadSpec(task="math", steps=30, batch=32, n=8, dp_ranks=4, max_response_len=16384, seed=31,
                        drift=1.2 ** (1 / 30) - 1)
    model = StepTimeModel(validate_every=10)
    slower = dataclasses.replace(model, a_gen=model.a_gen * 1.05, b_tail=model.b_tail * 1.05, b_vol=model.b_vol * 1.05)
    runs = {"main": (spec, model), "slower": (dataclasses.replace(spec, seed=33), slower)}

    def job(name: str, *steps: str) -> dict[str, subprocess.CompletedProcess]:
        folder = tmp_path / name
        folder.mkdir()
        write_step_log(lengths, *runs[name], folder / "logs")
        env = os.environ | {
            "LOGS_DIR": str(folder / "logs"), "RUN_NAME": workflow()["env"]["RUN_NAME"],
            "POLYTRACE_DB": "polytrace.duckdb", "BASELINE_LAKE": str(tmp_path / "baseline-lake"),
            "MAX_SLOWDOWN": workflow()["env"]["MAX_SLOWDOWN"],
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        return {step: subprocess.run(["bash", "-e", "-c", scripts[step]], cwd=folder, env=env, capture_output=True,
                                     text=True, timeout=600) for step in ("Ingest the logs", *steps)}

    recorded = job("main", "Record this run as the baseline")
    assert all(r.returncode == 0 for r in recorded.values()), recorded
    assert (tmp_path / "baseline-lake" / "manifest.json").exists()
    gate = job("slower", "Gate against the baseline")["Gate against the baseline"]
    assert gate.returncode == 1 and "regression: gen +" in gate.stdout, gate.stdout + gate.stderr
