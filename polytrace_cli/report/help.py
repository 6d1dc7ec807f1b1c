"""What would help: counterfactual savings the data can support, each computed on the quantity that sets
the step's time.

For a run with step timings (a fitted step-time model), `simulate.advice.priced_policies` prices the
fixed policies and those whose parameters the run's data chooses (a max-response-len cutting the
longest 5% of responses, never on a collapsed run or below its typical length, the validate-every /
checkpoint-every that brings an overhead above 5% of the wall time to about 2%, and the one-step-off
share of GPUs with the lowest predicted wall time): one entry per policy (MODEL_ENTRY_KEYS) (`why` says
how the parameter was chosen, null for the fixed policies), ranked by saving_s (policies the model
cannot price last, with their note instead of a number); saving = saving_s / the model's replay of the
run; saving_se_s is the bootstrap standard error over steps; `certainty` is how sure the saving is
(POLICY_NOTES: `exact` from the log, `model` from the fitted model, "model, doubtful" when the backtest
is flagged, `assumption-bound` when it rests on what the run would have done that the logs cannot
check); `on_page` is whether the page's table shows it (the SHOWN_POLICIES largest savings of at least
ON_PAGE_SAVING of the run; the others are folded into one line).
`backtest` is the model's step-time accuracy on held-out steps (`simulate.backtest_run`) beside the
fair median baseline's and the recent baseline's, `flagged` when below the better of the two.

Every other run with imbalance data gets the data-parallel rebalancing counterfactual of the imbalance
analysis: `{run, policy, basis, saving, certainty, reason, on_page, text}` where saving = the mean over steps of
`step_saving` (see `analyze.imbalance`): for sampled runs the rollout waits for the longest response
(makespan λ), which moving prompts between ranks cannot shorten, so the saving is 0 and the text says
what the token-load figure would have claimed; for console runs with verl's global_seqlen metrics,
saving = 1 − balanced_max / max of the token loads. Other policies are predicted by `polytrace whatif`.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl

from polytrace_cli.analyze import imbalance
from polytrace_cli.analyze.common import run_names
from polytrace_cli.display import duration

WHATIF_NOTE = ("Savings are priced by each run's step-time model, as polytrace whatif RUN --policy P prices them "
               "(and other policies); runs without step timings get only the rebalancing counterfactual.")
# The keys of a model entry and of its `backtest`.
MODEL_ENTRY_KEYS = ("run", "policy", "basis", "saving", "saving_s", "saving_se_s", "certainty", "assumption", "reason",
                    "why", "backtest", "on_page", "text")
BACKTEST_KEYS = ("accuracy", "median_baseline", "recent_baseline", "flagged", "steps", "reason")
# A saving smaller than this share of the run (or none, or a cost), or past the SHOWN_POLICIES largest, is
# folded into one line on the page.
ON_PAGE_SAVING = 0.005  # as simulate.advice.MIN_LEVER_SHARE: explain's levers and the table agree
SHOWN_POLICIES = 4
# How sure a saving is: read from the log, priced on the fitted model, or resting on an assumption about what
# the run would have done that the logs cannot check.
CERTAINTY_KEYS = ("exact", "model", "assumption-bound")
EXACT, MODEL, ASSUMPTION_BOUND = CERTAINTY_KEYS


@dataclass(frozen=True)
class PolicyNote:
    """What the page says of a policy: how sure its saving is, what it does (the row's why when the data
    did not choose its parameter) and its assumption (the full statement is its docstring in
    simulate.policies)."""

    certainty: str
    does: str
    assumption: str


# One per policy of `simulate.policies.POLICIES`, under its name there (tests/test_report_help.py checks).
POLICY_NOTES = {
    "balance": PolicyNote(
        MODEL, "even out the DP ranks' tokens in the training stages",
        "every DP rank gets the mean rank's tokens in the forward and update stages; generation is unchanged "
        "and the balancing itself is free"),
    "no-validation": PolicyNote(
        EXACT, "drop the logged validation",
        "the logged validation seconds are removed and nothing else changes (exact from the log)"),
    "validate-every": PolicyNote(
        MODEL, "validate less often",
        "validation runs on every K-th step and the last, each at the median logged validation seconds"),
    "checkpoint-every": PolicyNote(
        MODEL, "checkpoint less often",
        "a checkpoint on every K-th step and the last, each at the median logged checkpoint seconds"),
    "max-response-len": PolicyNote(
        ASSUMPTION_BOUND, "cap the response length",
        "responses are cut at the new cap and are otherwise the same (what the policy learns to write under a "
        "shorter cap is not modelled)"),
    "partial-rollout": PolicyNote(
        ASSUMPTION_BOUND, "stop each rollout at 90% of its responses done",
        "each step's rollout stops once 90% of its new responses are done and the rest finish in later steps "
        "(their staleness is not modelled)"),
    "one-step-off": PolicyNote(
        ASSUMPTION_BOUND, "overlap the next rollout with training on split GPUs",
        "rollout of step t+1 overlaps training of step t on split GPUs; the longest response decodes no faster "
        "on more GPUs, the token volume does (the one-step staleness is not modelled)"),
    "gpu-split": PolicyNote(
        ASSUMPTION_BOUND, "give the rollout another share of the GPUs",
        "an asynchronous run put through its rollout/trainer pipeline at another GPU split: the rollout's "
        "seconds scale with its GPUs and the trainer's with theirs (linear scaling; a tail that does not "
        "shorten with more GPUs makes more rollout GPUs worth less)"),
    "staleness": PolicyNote(
        ASSUMPTION_BOUND, "let samples be more (or fewer) model versions stale",
        "an asynchronous run put through its pipeline at another staleness limit: stale samples are waited "
        "for, never dropped, and what staler samples do to learning is not priced"),
}
# Kept for readers of the assumptions alone.
ASSUMPTIONS = {name: note.assumption for name, note in POLICY_NOTES.items()}


def _percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def policy_note(policy: str) -> PolicyNote:
    """The note of a policy as priced (`max-response-len=206` is `max-response-len`'s)."""
    return POLICY_NOTES[policy.split("=")[0]]


def _backtest(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """The model's step-time accuracy (%) on held-out steps beside the fair median and recent baselines';
    `flagged` when the model does worse than the better of them; accuracy None (with the reason) when
    there is no backtest."""
    from polytrace_cli.simulate import backtest_run

    try:
        step = backtest_run(con, run_id).step
    except Exception as error:  # noqa: BLE001 - a run without a backtest still gets its predictions
        return {"accuracy": None, "median_baseline": None, "recent_baseline": None, "flagged": False,
                "reason": f"{error}".splitlines()[0] if f"{error}" else type(error).__name__}
    baselines = [b for b in (step.median_baseline, step.recent_baseline) if b is not None]
    flagged = step.accuracy is not None and bool(baselines) and step.accuracy < max(baselines)
    return {"accuracy": step.accuracy, "median_baseline": step.median_baseline,
            "recent_baseline": step.recent_baseline, "flagged": flagged, "steps": step.steps, "reason": None}


def backtest_sentence(run: str, backtest: dict) -> str:
    """The backtest shown beside a run's predictions, in one sentence."""
    if backtest["accuracy"] is None:
        return f"{run}: the step-time model could not be backtested ({backtest['reason']})."
    baselines = [f"{name} {backtest[key]:.1f}%" for name, key in
                 (("median baseline", "median_baseline"), ("recent baseline", "recent_baseline"))
                 if backtest.get(key) is not None]
    text = f"{run}: the step-time model predicts held-out step times {backtest['accuracy']:.1f}% accurately"
    if baselines:
        text += f" ({', '.join(baselines)})"
    if backtest["flagged"]:
        return text + ": worse than a baseline, so these predictions are doubtful."
    return text + "."


def _model_text(run: str, scenario, baseline_s: float, why: str | None = None) -> str:
    if scenario.saving_s is None:
        return f"{run}: {scenario.policy}: no estimate: {scenario.note}."
    verb = "would save" if scenario.saving_s >= 0 else "would cost"
    spread = f" ± {duration(scenario.saving_se_s)}" if scenario.saving_se_s else ""
    chosen = f" ({why})" if why else ""
    note = f" {scenario.note[0].upper()}{scenario.note[1:]}." if scenario.note else ""
    return (f"{run}: {scenario.policy}{chosen} {verb} {duration(abs(scenario.saving_s))}{spread}, "
            f"{abs(scenario.saving_share or 0):.1%} of the {duration(baseline_s)} the model replays. "
            f"Assumes {policy_note(scenario.policy).assumption}.{note}")


def model_help(con: duckdb.DuckDBPyConnection, run_id: int, run: str) -> list[dict] | None:
    """The entries of a run with step timings (see the module docstring), ranked by predicted saving;
    None when the run has no step-time model; a `not-modelled` entry with the reason when whatif fails."""
    from polytrace_cli.errors import PolytraceError
    from polytrace_cli.model import logs_step_metrics
    from polytrace_cli.simulate.advice import priced_policies

    if not logs_step_metrics(con, run_id):
        return None
    try:
        priced = priced_policies(con, run_id)
    except PolytraceError:
        return None
    except Exception as error:  # noqa: BLE001 - one run's failure must not break the report
        reason = f"{type(error).__name__}: {error}".splitlines()[0]
        return [{"run": run, "policy": "not-modelled", "basis": "step-time model", "saving": None,
                 "reason": reason, "on_page": True,
                 "text": f"{run}: the step-time model's predictions failed ({reason})."}]
    backtest = _backtest(con, run_id)
    why, baseline = priced.why, priced.result.baseline_s
    out = []
    for scenario in priced.scenarios:
        note = policy_note(scenario.policy)
        certainty = note.certainty
        if certainty == MODEL and backtest["flagged"]:
            certainty = f"{MODEL}, doubtful"
        out.append({"run": run, "policy": scenario.policy, "basis": "step-time model", "saving": scenario.saving_share,
                    "saving_s": scenario.saving_s, "saving_se_s": scenario.saving_se_s, "certainty": certainty,
                    "assumption": note.assumption, "reason": scenario.note, "why": why.get(scenario.policy),
                    "backtest": backtest,
                    "on_page": scenario.saving_share is not None and scenario.saving_share >= ON_PAGE_SAVING,
                    "text": _model_text(run, scenario, baseline, why.get(scenario.policy))})
    out.sort(key=lambda e: (e["saving_s"] is None, -(e["saving_s"] or 0.0)))
    for index, entry in enumerate(out):
        entry["on_page"] = entry["on_page"] and index < SHOWN_POLICIES
    return out


def backtest_lines(entries: list[dict]) -> dict[str, str]:
    """run -> the backtest sentence, for the runs whose entries come from the step-time model."""
    return {e["run"]: backtest_sentence(e["run"], e["backtest"]) for e in entries if e.get("backtest")}


def model_help_by_run(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> dict[int, list[dict] | None]:
    """run id -> the run's `model_help` entries."""
    return {run_id: model_help(con, run_id, run) for run_id, run in run_names(con, run_ids).items()}


def build_help(summaries: dict[str, pl.DataFrame], con: duckdb.DuckDBPyConnection | None = None,
               run_ids: list[int] | None = None, modelled_entries: dict[int, list[dict] | None] | None = None
               ) -> list[dict]:
    """The step-time model's entries for each run with step timings (when `con` is given), then one
    rebalancing entry per other run with imbalance data (see the module docstring); empty when none has.
    `modelled_entries` is `model_help_by_run` when computed already (the report's second process does)."""
    out: list[dict] = []
    modelled: set[str] = set()
    if con is not None:
        if modelled_entries is None:
            modelled_entries = model_help_by_run(con, run_ids or [])
        for run_id, run in run_names(con, run_ids or []).items():
            entries = modelled_entries[run_id]
            if entries:
                out += entries
                if entries[0]["policy"] != "not-modelled":
                    modelled.add(run)
    return out + [entry for entry in _rebalancing(summaries) if entry["run"] not in modelled]


def _rebalancing(summaries: dict[str, pl.DataFrame]) -> list[dict]:
    summary = summaries.get("imbalance")
    if summary is None or summary.height == 0:
        summary = pl.DataFrame(schema=imbalance.SUMMARY_COLUMNS)
    out = []
    for row in summary.filter(pl.col("mean_lambda").is_not_null()).iter_rows(named=True):
        saving, token_saving = row["mean_step_saving"], row["mean_saving"]
        if row["saving_basis"] == "makespan":
            text = (f"{row['run']}: rebalancing prompts across data-parallel ranks would save "
                    f"{_percent(saving or 0.0)} of rollout time. The rollout waits for the longest response "
                    f"(makespan λ {row['mean_makespan_lambda']:.2f}), which no repartition shortens; the token-load "
                    f"λ {row['mean_lambda']:.2f} would suggest {_percent(token_saving or 0.0)}, but token load "
                    "does not set this step's time.")
        elif saving is not None:
            text = (f"{row['run']}: balancing the training batch's token sums across ranks would cut the "
                    f"token-bound stages by {_percent(saving)} (token λ {row['mean_lambda']:.2f} → "
                    f"{row['mean_lambda_balanced']:.2f}).")
        else:
            continue
        out.append({"run": row["run"], "policy": "rebalance-dp-ranks", "basis": row["saving_basis"],
                    "saving": saving, "certainty": MODEL, "reason": row["saving_basis_reason"],
                    "on_page": saving is not None and saving >= ON_PAGE_SAVING, "text": text})
    return out
