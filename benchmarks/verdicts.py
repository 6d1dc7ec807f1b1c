"""`check --baseline` verdicts on generated pairs: recall of an injected 5% efficiency slowdown, false alarms
and inconclusive verdicts when only the workload drifts, against the raw mean-step gate beside it.

Each pair is two verl logs from one known step-time model (`polytrace_cli.workload.steplog`: the math
length model, 32 prompts × 8 responses over 4 DP ranks, a 16,384-token cap the longest response
reaches, validation every 10 steps, a checkpoint every 30; --steps steps per run, each drawn with its
own seed). Per pair: both runs' responses grow within the run by a share drawn from 0 to 30% (the
policy learning to answer at length); B's responses are A's × a factor drawn from 0.7 to 1.3 (both
clipped at the cap: the run whose factor is below 1 gets A's × 1 / factor, so neither run's answers are
cut below the cap); in 30% of the pairs B validates every 5 or every 20 steps instead of every 10; and
in every other pair one stage of B (gen, reward, old_log_prob, ref, update_actor in turn) is 5% slower
at every workload (its intercept and per-unit costs × 1.05).

The verdict is `diagnose.verdict.judge` on `explain --against` of the pair, as `polytrace check B
--baseline A --max-slowdown` computes it. Targets: recall (regression naming the injected stage) ≥ 95%,
false alarms (regression on a workload-only pair) ≤ 2% and none on pairs that differ in workload only,
inconclusive ≤ 5% of all pairs. The raw gate beside it is `--max-step-slowdown 2%` on the same pairs
(B's mean step more than 2% slower than A's): what gating on mean step times would have said.
Usage: python benchmarks/verdicts.py [--pairs N] [--steps N] [--seed N]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np

from polytrace_cli.diagnose.against import explain_against
from polytrace_cli.diagnose.verdict import INCONCLUSIVE, REGRESSION, judge
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.steplog import StepTimeModel, write_step_log
from polytrace_cli.workload.synth import WorkloadSpec

BASE_MODEL = StepTimeModel(validate_every=10, checkpoint_every=30)
INJECTED_STAGES = ("gen", "reward", "old_log_prob", "ref", "update_actor")
SLOWDOWN = 1.05
RAW_GATE = 0.02


def slower(model: StepTimeModel, stage: str, factor: float = SLOWDOWN) -> StepTimeModel:
    """The model with one stage `factor` times slower at every workload (intercept and per-unit costs)."""
    if stage == "gen":
        return dataclasses.replace(model, a_gen=model.a_gen * factor, b_tail=model.b_tail * factor,
                                   b_vol=model.b_vol * factor)
    if stage == "reward":
        return dataclasses.replace(model, a_reward=model.a_reward * factor, b_reward=model.b_reward * factor)
    return dataclasses.replace(model, token_stages=tuple(
        (name, a * factor, b * factor) if name == stage else (name, a, b) for name, a, b in model.token_stages))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lengths, _ = preset("math")
    rng = np.random.default_rng(args.seed)
    rows = []
    judging = 0.0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        con = open_store(root / "store.duckdb")
        for pair in range(args.pairs):
            grow = rng.uniform(0.0, 0.3)
            spec_a = WorkloadSpec(task="math", steps=args.steps, batch=32, n=8, dp_ranks=4, max_response_len=16384,
                                  seed=2 * pair + 1 + 1000 * args.seed, drift=(1 + grow) ** (1 / args.steps) - 1)
            spec_b = dataclasses.replace(spec_a, seed=spec_a.seed + 1)
            ratio = rng.uniform(0.7, 1.3)
            scale_a = max(1.0, 1.0 / ratio)
            model_a = dataclasses.replace(BASE_MODEL, response_scale=scale_a)
            model_b = dataclasses.replace(BASE_MODEL, response_scale=scale_a * ratio)
            if rng.random() < 0.3:
                model_b = dataclasses.replace(model_b, validate_every=int(rng.choice([5, 20])))
            injected = INJECTED_STAGES[(pair // 2) % len(INJECTED_STAGES)] if pair % 2 else None
            if injected:
                model_b = slower(model_b, injected)
            for name, spec, model in ((f"a{pair}", spec_a, model_a), (f"b{pair}", spec_b, model_b)):
                write_step_log(lengths, spec, model, root / name)
                ingest_paths(con, [root / name], run_name=name)
            clock = time.perf_counter()
            comparison = explain_against(con, f"b{pair}", f"a{pair}")
            verdict = judge(comparison)
            judging += time.perf_counter() - clock
            rows.append({"pair": pair, "injected": injected, "verdict": verdict.verdict, "stage": verdict.stage,
                         "raw_fail": comparison.slowdown > RAW_GATE, "ratio": ratio, "grow": grow,
                         "headline": verdict.headline()})
        con.close()
    injected = [r for r in rows if r["injected"]]
    drift_only = [r for r in rows if not r["injected"]]
    recall = sum(r["verdict"] == REGRESSION and r["stage"] == r["injected"] for r in injected) / len(injected)
    false_alarms = sum(r["verdict"] == REGRESSION for r in drift_only)
    undecided = sum(r["verdict"] == INCONCLUSIVE for r in rows) / len(rows)
    raw_recall = sum(r["raw_fail"] for r in injected) / len(injected)
    raw_false = sum(r["raw_fail"] for r in drift_only)
    print(f"{args.pairs} pairs × {args.steps} steps per run (seed {args.seed}); {len(injected)} with a 5% slowdown "
          f"of one stage, {len(drift_only)} with workload drift only")
    print(f"{'':34s} {'verdict':>10s} {'raw gate 2%':>12s} target")
    print(f"{'recall (injected stage named)':34s} {recall:>10.0%} {raw_recall:>12.0%} >= 95%")
    print(f"{'false alarms (workload only)':34s} {false_alarms / len(drift_only):>10.0%} "
          f"{raw_false / len(drift_only):>12.0%} <= 2%, and none")
    print(f"{'inconclusive (all pairs)':34s} {undecided:>10.0%} {'':>12s} <= 5%")
    print(f"seconds: {time.perf_counter() - started:.1f} in all, {judging:.1f} comparing and judging "
          f"({judging / len(rows) * 1000:.0f} ms per pair)")
    for row in rows:
        wrong = (row["verdict"] != REGRESSION or row["stage"] != row["injected"]) if row["injected"] \
            else row["verdict"] != "no change"
        if wrong:
            print(f"  pair {row['pair']}: injected {row['injected']}, responses ×{row['ratio']:.2f}, "
                  f"grow {row['grow']:.0%}: {row['headline']}")


if __name__ == "__main__":
    main()
