"""What bounds an asynchronous run, on generated runs of 10 scenarios with known truth
(`polytrace_cli.workload.async_scenarios`): rollout-bound, train-bound and weight-sync-bound at two GPU
splits each (and in verl's one-step-off and V1 separate-async modes), a staleness-throttled run and a
sync run, each a verl console log of --steps steps (math lengths, 48 prompts × 8 responses, 2 DP ranks).

Prints per scenario: the bound `explain` names and the truth, its seconds per step against the truth's
(the target: the bound right in ≥ 9 of 10, its seconds within 10%), whether any long_tail or
token_volume cause was put on the trainer's wait (never, in an asynchronous mode), the `whatif
--backtest` step accuracy against the median baseline given the same split (the target: mean step error
within 10%, ahead of the baseline), and, for the sync run against the fully-async run of the same
workload at p = 0.55, the overlap gained `explain --against` names against the truth (the sync run's
true generation seconds per step; within 10%); then `whatif --policy gpu-split=G / staleness=K` on a
fully-async run at p = 0.5 (4 GPUs), its saving as a share of the run against the generator's run at that
setting.
Usage: python benchmarks/async_bounds.py [--steps N] [--seed S]
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

from polytrace_cli.diagnose import explain_run
from polytrace_cli.diagnose.against import explain_against
from polytrace_cli.diagnose.explain import decompose_run
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.model import read_workload, run_info, training_mask
from polytrace_cli.simulate.backtest import backtest_run
from polytrace_cli.simulate.policies import whatif_run
from polytrace_cli.store import open_store
from polytrace_cli.workload.async_scenarios import SCENARIOS, relative_error, truth_bound
from polytrace_cli.workload.presets import preset
from polytrace_cli.workload.steplog import write_step_log
from polytrace_cli.workload.synth import WorkloadSpec


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    lengths, _ = preset("math")
    spec = WorkloadSpec(task="math", steps=args.steps, batch=48, n=8, dp_ranks=2, max_response_len=20480,
                        seed=args.seed)
    right, within, clean, backtests = 0, 0, 0, []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        con = open_store(root / "store.duckdb")
        truths = {}
        for index, (name, (model, expected)) in enumerate(SCENARIOS.items()):
            run = f"s{index}"
            written = write_step_log(lengths, spec, model, root / run, ("verl-console",))
            ingest_paths(con, [root / run], run_name=run)
            truth = truth_bound(written.frame)
            truths[name] = (run, written.frame)
            explanation = explain_run(con, run)
            measured = explanation.bounds["run"]
            error = relative_error(measured["seconds_per_step"], truth["seconds_per_step"])
            named = measured["bound"] == truth["bound"] == expected
            right += named
            within += named and error <= 0.10
            frame = read_workload(con, run_info(con, run).run_id)
            causes = decompose_run(frame, training_mask(frame)).causes
            on_wait = causes.filter((causes["stage"] == "trainer_wait")
                                    & causes["cause"].is_in(["long_tail", "token_volume"])).height
            clean += on_wait == 0
            line = (f"{name:42s} named {measured['bound']:15s} truth {truth['bound']:15s} "
                    f"{measured['seconds_per_step']:8.1f} s/step vs {truth['seconds_per_step']:8.1f} ({error:5.1%}); "
                    f"tail/volume causes on the wait: {on_wait}")
            if model.mode != "sync":
                result = backtest_run(con, run).to_dict()
                step = result["step"]
                backtests.append((name, step["accuracy"], step["median_baseline"]))
                line += f"; backtest step {step['accuracy']:.1f}% vs median {step['median_baseline']:.1f}%"
            print(line)
        # whatif on an asynchronous run: another GPU split and another staleness limit, priced from the run
        # at p = 0.5 (4 GPUs: 2 rollout, 2 trainer), against the generator's runs at those settings.
        wide = replace(spec, dp_ranks=4)
        priced = {}
        base_model = replace(SCENARIOS["rollout-bound p=0.55"][0], rollout_gpu_share=0.5)
        settings = {"gpu-split=0.75": dict(rollout_gpu_share=0.75), "gpu-split=0.25": dict(rollout_gpu_share=0.25),
                    "staleness=0": dict(staleness_limit=0), "staleness=2": dict(staleness_limit=2)}
        base_truth = write_step_log(lengths, wide, base_model, root / "w-base", ("verl-console",)).frame
        ingest_paths(con, [root / "w-base"], run_name="w-base")
        result = whatif_run(con, "w-base", list(settings)).to_dict()
        for scenario in result["scenarios"]:
            other = write_step_log(lengths, wide, replace(base_model, **settings[scenario["policy"]]),
                                   root / scenario["policy"], ("verl-console",)).frame
            true_share = 1.0 - float(other["step_s"].sum()) / float(base_truth["step_s"].sum())
            priced[scenario["policy"]] = (scenario["saving_share"], true_share)
        sync_run, sync_frame = truths["sync"]
        async_run, _ = truths["rollout-bound p=0.55"]
        comparison = explain_against(con, async_run, sync_run).to_dict()
        gained = next(c["seconds"] for c in comparison["causes"] if c["cause"] == "overlap_gained")
        true_gain = -float(sync_frame["gen_s"].mean())
        con.close()
    print(f"bound named right: {right}/{len(SCENARIOS)}; named right and its seconds within 10%: {within}/"
          f"{len(SCENARIOS)}; runs with no long_tail/token_volume cause on the wait: {clean}/{len(SCENARIOS)}")
    ahead = sum(accuracy > median for _, accuracy, median in backtests)
    worst = min(accuracy for _, accuracy, _ in backtests)
    print(f"backtest on {len(backtests)} asynchronous runs: worst step accuracy {worst:.1f}% (error "
          f"{100 - worst:.1f}%), ahead of the median baseline on {ahead}/{len(backtests)}")
    for policy, (share, true_share) in priced.items():
        print(f"whatif --policy {policy} on the fully-async run at p=0.5: saving {share:+.1%} of the run, "
              f"truth {true_share:+.1%} (the generator's run at that setting)")
    print(f"overlap gained (fully-async p=0.55 against sync): {gained:+.1f} s/step, truth {true_gain:+.1f} "
          f"({relative_error(gained, true_gain):.1%})")


if __name__ == "__main__":
    main()
