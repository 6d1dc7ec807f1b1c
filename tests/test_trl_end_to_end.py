"""explain, whatif, check and the report on a TRL run, through the command line.

The console log is written here from a known step-time model, as the Trainer prints it: one dict
per step under a progress bar redrawn with carriage returns. A TRL log has no stage timers, so the
model is one whole-step stage: step_time = 2.0 s + 0.012 s × longest response (± 0.2 s noise),
every 10th step reaching the 1,024-token cap with 1/16 of its responses clipped, and step 40 slowed
by 20 s that nothing in the log explains.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app

STEPS = 80
CAP = 1024
BASE_S, PER_TOKEN_S, SLOW_STEP, SLOW_EXTRA_S = 2.0, 0.012, 40, 20.0


def write_trl_log(path: Path) -> None:
    rng = random.Random(3)
    lines = ["trl==0.19.1"]
    elapsed, tokens = 0.0, 0
    bar = f"\r  0%|          | 0/{STEPS} [00:00<?, ?it/s]"
    for step in range(1, STEPS + 1):
        mean = rng.uniform(200, 400)
        longest = float(CAP) if step % 10 == 0 else round(rng.uniform(500, 900), 1)
        seconds = BASE_S + PER_TOKEN_S * longest + rng.uniform(-0.2, 0.2) + (SLOW_EXTRA_S if step == SLOW_STEP else 0)
        elapsed += seconds
        tokens += int(64 * (mean + 150))
        drawn = f"\r{100 * step // STEPS:3d}%|█| {step}/{STEPS} [{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}<00:10, {seconds:.2f}s/it]"
        metrics = {"loss": 0.001, "num_tokens": float(tokens), "completions/mean_length": round(mean, 2),
                   "completions/max_length": longest, "completions/clipped_ratio": 0.0625 if longest == CAP else 0.0,
                   "reward": 0.5, "kl": 0.001, "step_time": round(seconds, 3), "epoch": round(step / STEPS, 2)}
        lines.append(bar + drawn + "\r" + " " * 40 + "\r" + repr(metrics))
        bar = drawn
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def trl_store(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("trl") / "grpo_run"
    folder.mkdir()
    write_trl_log(folder / "train.log")
    db = str(folder.parent / "store.duckdb")
    result = CliRunner().invoke(app, ["ingest", str(folder), "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    assert '"trl-console"' in result.output
    return db


def test_explain_fits_a_whole_step_model_and_names_the_slow_step(trl_store):
    result = CliRunner().invoke(app, ["explain", "grpo_run", "--db", trl_store, "--json"])
    assert result.exit_code == 0, result.output
    explained = json.loads(result.output)
    whole = explained["model"]["whole_step"]
    assert abs(whole["intercept"] - BASE_S) < 0.3 and abs(whole["r_max"] - PER_TOKEN_S) < 0.0006
    [slow] = explained["steps"]
    assert slow["step"] == SLOW_STEP


def test_whatif_backtests_the_whole_step_model_of_a_trl_log(trl_store):
    """A TRL log has a step time and no stage timer: the backtest holds out the second half of the
    steps and predicts each from the whole-step model fitted on the first (step_time = 2.0 s + 0.012 s
    × longest response, ± 0.2 s), so it is far better than a constant guess."""
    result = CliRunner().invoke(app, ["whatif", "grpo_run", "--db", trl_store, "--backtest", "--json"])
    assert result.exit_code == 0, result.output
    step = json.loads(result.output)["step"]
    assert step["steps"] == STEPS // 2
    assert step["accuracy"] > 90 and step["accuracy"] > step["median_baseline"]


def test_check_measures_the_clip_ratio_and_cannot_measure_imbalance(trl_store):
    result = CliRunner().invoke(app, ["check", "grpo_run", "--db", trl_store, "--max-clip-ratio", "0.05",
                                      "--max-imbalance", "1.2", "--json"])
    assert result.exit_code == 1
    checks = {c["threshold"]: c for c in json.loads(result.output)["checks"]}
    # 8 of 80 steps clip 1/16 of their responses: 8 × 0.0625 / 80.
    assert checks["max_clip_ratio"]["measured"] == pytest.approx(0.00625) and checks["max_clip_ratio"]["status"] == "pass"
    assert checks["max_imbalance"]["status"] == "not measurable"


@pytest.mark.slow
def test_report_finds_the_slow_step_and_says_what_the_log_lacks(trl_store, tmp_path):
    result = CliRunner().invoke(app, ["report", "grpo_run", "--db", trl_store, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "grpo_run" / "summary.json").read_text())
    findings = {finding["cause"]: finding for finding in summary["findings"]}
    assert findings["unexplained"]["at_steps"] == [SLOW_STEP]
    assert findings["unexplained"]["seconds"] == pytest.approx(SLOW_EXTRA_S, abs=0.6)
    assert "slot-idle" in findings
    # The whole-step model backtests on a TRL log: no help is refused for lack of a generation time.
    reasons = {help["backtest"]["reason"] for help in summary["what_would_help"]}
    assert not any("generation time" in (reason or "") for reason in reasons)
