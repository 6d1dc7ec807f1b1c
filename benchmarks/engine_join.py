"""Engine telemetry joined to steps, against a known engine model (`workload/engine_model.py`).

Scenarios: long-tailed rollouts with the KV cache ample (the tail) at three tail weights, and a
KV-limited engine (preemptions) at two cache sizes, each over several steps, scraped every 1 s or 2 s.
Each run's steps are written as an MLflow file store (the real MLflow, with the steps' wall clock) and
its engine as a scrape file; polytrace ingests both and `analyze engine` joins them. Per step it
compares the measured low-concurrency and tail shares with the model's truth on its own time grid,
checks every scrape landed in a step's window (or in the untimed gaps injected between steps, give or
take one scrape per gap), and that each step's state told (`tail`, `full` or `busy`) is the one the
model's truth gives by the same rule. A baseline gets the same scrapes: the share of
scrapes with low concurrency, unweighted and not cut to the rollout (what one reads off a dashboard).
Targets: every |measured − truth| ≤ 5 points; every step's state right, the tail and a full engine both told.
Usage: python benchmarks/engine_join.py [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from polytrace_cli.analyze import engine  # noqa: E402
from polytrace_cli.analyze.common import ALL_STEPS  # noqa: E402
from polytrace_cli.ingest.driver import ingest_paths  # noqa: E402
from polytrace_cli.store import open_store  # noqa: E402
from polytrace_cli.workload.engine_model import LOW_SHARE_OF_PEAK, EngineModel, simulate  # noqa: E402
from test_engine_telemetry import MLFLOW_WRITER  # noqa: E402

SCENARIOS = {
    "tail-light": ("tail", EngineModel(requests=96, response_sigma=0.4, seed=11)),
    "tail": ("tail", EngineModel(requests=96, response_sigma=0.6, seed=12)),
    "tail-heavy": ("tail", EngineModel(requests=128, response_sigma=0.9, scrape_every=2.0, seed=13)),
    "full": ("full", EngineModel(requests=160, kv_tokens=24_000, seed=14)),
    "full-tight": ("full", EngineModel(requests=192, kv_tokens=16_000, scrape_every=2.0, seed=15)),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        runs = {}
        for name, (_, model) in SCENARIOS.items():
            untimed = [3.0 * (index % 3) for index in range(args.steps)]
            runs[name] = (simulate(model, args.steps, untimed_s=untimed), untimed, model)
            (base / name).mkdir()
            (base / name / "engine.prom").write_text(runs[name][0].scrapes)
        env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true", "MLFLOW_ENABLE_TELEMETRY": "false", "DO_NOT_TRACK": "1"}
        subprocess.run([sys.executable, "-c", MLFLOW_WRITER,
                        json.dumps({str(base / n): r[0].steps for n, r in runs.items()})], env=env, check=True)
        con = open_store(base / "store.duckdb")
        print(f"{'scenario':<11} {'state':>6} {'told':>9} {'max |low − truth|':>18} {'max |tail − truth|':>19} "
              f"{'baseline |low − truth|':>23} {'outside':>8} {'expected':>9}")
        for name, (run, untimed, model) in runs.items():
            ingest_paths(con, [base / name], run_name=name)
            [run_id] = con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchall()[0]
            detail = engine.per_step(con, [run_id], ALL_STEPS).sort("step")
            low_errors = [abs(m - t["low_share"]) for m, t in zip(detail["low_share"].to_list(), run.truth)]
            tail_errors = [abs(m - t["tail_share"]) for m, t in zip(detail["tail_share"].to_list(), run.truth)]
            baseline = _baseline(con, run_id, run.truth)
            [summary] = engine.summary(con, [run_id], ALL_STEPS).iter_rows(named=True)
            # Scrapes fall outside the steps only in the untimed gaps (the last one after the last step).
            expected_outside = sum(untimed) / model.scrape_every
            outside_ok = abs(summary["samples_outside_steps"] - expected_outside) <= len(untimed)
            told_states = detail["engine_state"].to_list()
            true_states = [_true_state(t) for t in run.truth]
            told = sorted(set(told_states))
            right = told_states == true_states and SCENARIOS[name][0] in told
            ok = (right and outside_ok and max(low_errors) <= 0.05 and max(tail_errors) <= 0.05
                  and len(low_errors) == args.steps)
            failures += not ok
            print(f"{name:<11} {SCENARIOS[name][0]:>6} {','.join(told):>9} {max(low_errors):>18.3f} "
                  f"{max(tail_errors):>19.3f} {baseline:>23.3f} {summary['samples_outside_steps']:>8} "
                  f"{expected_outside:>9.0f}{'' if ok else '   MISSED'}")
        con.close()
    print("targets: every step within 5 points of the truth, the state right:", "met" if not failures else "NOT met")
    return 1 if failures else 0


def _true_state(truth: dict) -> str:
    """The state a step truly was in, by the rule `analyze engine` applies, on the model's own time grid."""
    if truth["kv_full_share"] >= engine.STATE_SHARE or truth["preemptions"] > 0:
        return "full"
    return "tail" if truth["tail_share"] >= engine.STATE_SHARE else "busy"


def _baseline(con, run_id: int, truth: list[dict]) -> float:
    """max over steps of |share of scrapes at low concurrency over the whole run − the step's truth|."""
    rows = con.execute("SELECT value FROM engine_metrics WHERE run_id = ? AND metric = 'requests_running'",
                       [run_id]).fetchall()
    values = [value for (value,) in rows]
    peak = max(values)
    share = sum(value <= LOW_SHARE_OF_PEAK * peak for value in values) / len(values)
    return max(abs(share - t["low_share"]) for t in truth)


if __name__ == "__main__":
    sys.exit(main())
