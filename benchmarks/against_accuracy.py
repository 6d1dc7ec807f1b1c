"""`explain --against` on generated pairs: how often the changed factor is named first, its share of the
difference, the largest cause of same-configuration pairs, and the seconds a comparison takes.

For each seed, a baseline verl log (math lengths, 32 prompts × 8 responses, 4 DP ranks, a 16,384-token
cap, validation every 10 steps, a checkpoint every 30; `polytrace_cli.workload.steplog`) and one log
per factor with that factor changed: generation 30% slower per token, responses × 1.5, busiest rank
1.5 × the mean, validation every 5 steps, 8 DP ranks, a cap twice as high (the baseline's longest
response sits at its cap); and the baseline drawn with another seed.
Prints per factor: pairs where the factor came first, the smallest share it carried (the tests ask
≥ 70%), and for same-configuration pairs the largest |cause| as a share of the step (the tests ask
< 3%); then the seconds of one `explain_against` on two runs of --long-steps steps (in process, the
store already ingested), against the seconds of `explain_run` on one of them (what one run's model
costs), so the comparison is seen to cost about two explains.
Usage: python benchmarks/against_accuracy.py [--seeds N] [--steps N] [--long-steps N]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from polytrace_cli.diagnose import explain_run
from polytrace_cli.diagnose.against import explain_against
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.store import open_store
from polytrace_cli.ingest.registry import declared_metric_names
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.steplog import StepTimeModel, write_step_log
from polytrace_cli.workload.synth import WorkloadSpec

BASE_MODEL = StepTimeModel(validate_every=10, checkpoint_every=30)
FACTORS = {
    "gen cost per token ×1.3": ("model", dict(b_tail=0.012 * 1.3, b_vol=2.0e-5 * 1.3), "efficiency"),
    "responses ×1.5": ("model", dict(response_scale=1.5), "token_volume"),
    "imbalance 1.5": ("model", dict(imbalance=1.5), "dp_imbalance"),
    "validation every 5": ("model", dict(validate_every=5), "validation"),
    "8 DP ranks": ("spec", dict(dp_ranks=8), "gpu_count"),
    "cap 32,768 (longer tail)": ("spec", dict(max_response_len=32768), "long_tail"),
}


def _spec(seed: int, steps: int) -> WorkloadSpec:
    return WorkloadSpec(task="math", steps=steps, batch=32, n=8, dp_ranks=4, max_response_len=16384, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--long-steps", type=int, default=2000)
    args = parser.parse_args()
    lengths, _ = preset("math")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        con = open_store(root / "store.duckdb", metric_names=declared_metric_names)
        first = {name: 0 for name in FACTORS}
        smallest = {name: float("inf") for name in FACTORS}
        same_worst = 0.0
        for seed in range(1, args.seeds + 1):
            spec = _spec(seed, args.steps)
            runs = {"base": (spec, BASE_MODEL), "reseeded": (dataclasses.replace(spec, seed=seed + 1000), BASE_MODEL)}
            for name, (where, change, _) in FACTORS.items():
                runs[name] = ((dataclasses.replace(spec, **change), BASE_MODEL) if where == "spec"
                              else (spec, dataclasses.replace(BASE_MODEL, **change)))
            for name, (run_spec, model) in runs.items():
                write_step_log(lengths, run_spec, model, root / f"{seed}-{name}")
                ingest_paths(con, [root / f"{seed}-{name}"], run_name=f"{seed}-{name}")
            for name, (_, _, cause) in FACTORS.items():
                doc = explain_against(con, f"{seed}-{name}", f"{seed}-base").to_dict()
                top = doc["causes"][0]
                first[name] += top["cause"] == cause
                carried = sum(c["seconds"] for c in doc["causes"] if c["cause"] == cause) / doc["delta_s"]
                smallest[name] = min(smallest[name], carried)
            doc = explain_against(con, f"{seed}-reseeded", f"{seed}-base").to_dict()
            same_worst = max(same_worst, max(abs(c["seconds"]) for c in doc["causes"]) / doc["a_step_s"])
        print(f"{args.seeds} seeds × {args.steps} steps per run")
        print(f"{'factor changed':28s} {'named first':>12s} {'smallest share':>15s}")
        for name in FACTORS:
            print(f"{name:28s} {first[name]:>7d} of {args.seeds} {smallest[name]:>15.1%}")
        print(f"same configuration, another seed: largest |cause| = {same_worst:.2%} of the step (target < 3%)")

        long_spec = _spec(1, args.long_steps)
        for name, model in (("long-a", BASE_MODEL), ("long-b", dataclasses.replace(BASE_MODEL, validate_every=5))):
            write_step_log(lengths, long_spec, model, root / name)
            ingest_paths(con, [root / name], run_name=name)
        started = time.perf_counter()
        explain_run(con, "long-a")
        one = time.perf_counter() - started
        started = time.perf_counter()
        explain_against(con, "long-b", "long-a")
        both = time.perf_counter() - started
        print(f"{args.long_steps:,} steps per run: explain_against {both:.2f} s, explain_run on one run {one:.2f} s")
        con.close()


if __name__ == "__main__":
    main()
