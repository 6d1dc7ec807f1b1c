"""`polytrace whatif`: backtest the step-time model, or predict a run under other policies."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from polytrace_cli.commands.common import (CsvOption, DbOption, JsonOption, WaitOption, WideOption, console,
                                           emit_frame, user_errors)
from polytrace_cli.errors import PolytraceError

if TYPE_CHECKING:
    import polars as pl

POLICY_OPTION_HELP = ("A policy to predict, repeatable: balance, no-validation, validate-every=K, checkpoint-every=K, "
                      "max-response-len=N, partial-rollout=F, one-step-off[=G].")


@user_errors
def whatif(
    run: Annotated[str, typer.Argument(help="The run's name.")],
    backtest: Annotated[bool, typer.Option("--backtest", help="Fit on the first half of the steps and report "
                                           "the accuracy on the rest, beside the median, recent and previous "
                                           "baselines.")] = False,
    walk_forward: Annotated[bool, typer.Option("--walk-forward", help="With --backtest: also predict each held-out "
                                               "step from every step before it, refitting as a live monitor "
                                               "would, beside the fixed split.")] = False,
    refit_every: Annotated[int | None, typer.Option("--refit-every", min=1, help="With --walk-forward: refit every "
                                                    "K steps (default: every step up to 60 held-out steps, "
                                                    "else at most 60 refits).")] = None,
    policy: Annotated[list[str] | None, typer.Option("--policy", help=POLICY_OPTION_HELP)] = None,
    training_scale: Annotated[float | None, typer.Option("--training-scale", help="For one-step-off: the measured "
                                                         "slowdown of the training stages on their share of the "
                                                         "GPUs (default 1/(1 − G), assumed).")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wide: WideOption = False,
    wait: WaitOption = 0,
) -> None:
    """Backtest the run's step-time model (--backtest), or predict its wall time under other policies
    (--policy P ...) against the model's replay of the run as it was."""
    if backtest == bool(policy):
        raise PolytraceError("give either --backtest or at least one --policy")
    if as_json and as_csv:
        raise PolytraceError("choose one of --json and --csv")
    if (walk_forward or refit_every) and not backtest:
        raise PolytraceError("--walk-forward and --refit-every go with --backtest")
    if refit_every and not walk_forward:
        raise PolytraceError("--refit-every goes with --walk-forward")
    if training_scale is not None and not any(text.strip().startswith("one-step-off") for text in policy or []):
        raise PolytraceError("--training-scale goes with --policy one-step-off")
    from polytrace_cli.facade import Store
    from polytrace_cli.simulate import parse_policy

    for text in policy or []:  # a malformed policy fails before the store is opened
        parse_policy(text)
    with Store.open(db, read_only=True, wait=wait) as store:
        result = (store.whatif(run, backtest=True, walk_forward=walk_forward, refit_every=refit_every) if backtest
                  else store.whatif(run, policy, training_scale=training_scale))
    if as_json:
        sys.stdout.write(result.to_json() + "\n")
        return
    if as_csv:  # the table's numbers unrounded, notes included
        emit_frame(result.table(), as_csv=True)
        return
    import polars as pl

    if backtest:
        table = result.table()
        if not walk_forward:
            table = table.drop([name for name in table.columns if name.startswith("walk_")])
        numbers = [name for name in table.columns if name not in ("stage", "steps", "method")]
        emit_frame(table.with_columns(pl.col(numbers).round(1)),
                   title=f"{result.run}: accuracy % on {result.test_steps} held-out steps "
                   f"(from step {result.first_test_step}; fitted on the {result.train_steps} before)",
                   identity=["stage"], wide=wide)
        notes = list(result.notes)
    else:
        table = result.table()
        emit_frame(_scenarios_for_people(table.drop("note")),
                   title=f"{result.run}: predicted wall time over {result.steps} steps", identity=["policy"], wide=wide)
        notes = [f"{policy}: {note}" for policy, note in table.select("policy", "note").iter_rows() if note]
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False)


def _scenarios_for_people(table: pl.DataFrame) -> pl.DataFrame:
    """The what-if table as printed: seconds whole from 100 s on and to 0.1 s below (the model's
    error is far larger than a tenth of a second), the saving's standard error as `saving_±_s` and
    its share of the replay as a percentage with one decimal."""
    import polars as pl

    seconds = ["predicted_s", "saving_s", "saving_se_s"]
    return table.with_columns(
        pl.when(pl.col(name).abs() >= 100).then(pl.col(name).round(0)).otherwise(pl.col(name).round(1)).alias(name)
        for name in seconds
    ).with_columns((pl.col("saving_share") * 100).round(1).alias("saving_%")).drop("saving_share").rename(
        {"saving_se_s": "saving_±_s"})
