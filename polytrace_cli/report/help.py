"""What would help: counterfactual savings the analyses can support, each computed on the quantity that sets
the step's time.

Today this is the data-parallel rebalancing counterfactual of the imbalance analysis, one entry per run
with imbalance data: `{run, policy, basis, saving, text}` where saving = the mean over steps of
`step_saving` (see `analyze.imbalance`): for sampled runs the rollout waits for the longest response
(makespan λ), which moving prompts between ranks cannot shorten, so the saving is 0 and the text says
what the token-load figure would have claimed; for console runs with verl's global_seqlen metrics,
saving = 1 − balanced_max / max of the token loads. Other policies are predicted by `polytrace whatif`.
"""

from __future__ import annotations

import polars as pl

from polytrace_cli.analyze import imbalance

WHATIF_NOTE = ("Other policies (length caps, partial rollout, less validation) are predicted from the run's step-time "
               "model by `polytrace whatif RUN --policy ...`; this report shows only the rebalancing counterfactual.")


def _percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def build_help(summaries: dict[str, pl.DataFrame]) -> list[dict]:
    """One rebalancing entry per run with imbalance data (see the module docstring); empty when none has."""
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
                    "saving": saving, "reason": row["saving_basis_reason"], "text": text})
    return out
