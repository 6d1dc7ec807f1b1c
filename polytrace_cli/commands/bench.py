"""`polytrace synth` and `polytrace demo`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polytrace_cli.commands.common import DbOption, console, emit_frame, fail, user_errors

DEMO_SEED = 2509


@user_errors
def synth(
    out: Annotated[Path, typer.Option(help="Folder to write the traces into.")],
    task: Annotated[str | None, typer.Option(help="Task label; without --params or --from-run, a built-in preset: math, code, search; with the published --params file: math or tool.")] = None,
    params: Annotated[Path | None, typer.Option(help="Parameters file: polytrace-params/1 or the published PolyTrace file.")] = None,
    from_run: Annotated[str | None, typer.Option(help="Fit this run of the store and sample from it, in its shape.")] = None,
    sampler: Annotated[str, typer.Option(help="parametric (fits) or empirical (stored quantiles).")] = "parametric",
    steps: Annotated[int | None, typer.Option(help="Workload steps.")] = None,
    batch: Annotated[int | None, typer.Option(help="Prompts per step.")] = None,
    n: Annotated[int | None, typer.Option(help="Responses per prompt.")] = None,
    dp_ranks: Annotated[int | None, typer.Option(help="Data-parallel ranks.")] = None,
    max_response_len: Annotated[int | None, typer.Option(help="Length cap: longer responses are clipped to it.")] = None,
    drift: Annotated[float | None, typer.Option(help="Relative change of response length per step, e.g. 0.005.")] = None,
    multiturn: Annotated[bool | None, typer.Option(help="Write multi-turn trajectories instead of packed lengths.")] = None,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed writes the same files.")] = 0,
    db: DbOption = None,
) -> None:
    """Sample a workload from fitted distributions and write it as PolyTrace traces."""
    from polytrace_cli.bench.distributions import load_params
    from polytrace_cli.bench.fidelity import workload_from_run
    from polytrace_cli.bench.presets import PRESETS, preset
    from polytrace_cli.bench.synth import WorkloadSpec, synthesize, with_overrides
    from polytrace_cli.store import open_store

    if params is not None and from_run is not None:
        raise fail("give either --params or --from-run, not both")
    if from_run is not None:
        con = open_store(db, read_only=True)
        try:
            model, base = workload_from_run(con, from_run, sampler=sampler, task=task)
        finally:
            con.close()
    elif task is None:
        raise fail("--task is needed without --params or --from-run (presets: " + ", ".join(PRESETS) + ")")
    elif params is not None:
        model = load_params(params, task=task, sampler=sampler)
        base = WorkloadSpec(task=task, n=model.n_sampling or 8, dp_ranks=model.dp_ranks or 2,
                            max_response_len=model.max_response_len, multiturn=bool(model.multiturn))
    else:
        model, base = preset(task)
    spec = with_overrides(base, steps=steps, batch=batch, n=n, dp_ranks=dp_ranks, max_response_len=max_response_len,
                          drift=drift, multiturn=multiturn, seed=seed)
    result = synthesize(model, spec, out)
    console.print(f"wrote {len(result.files)} file(s) to {out}: {result.samples:,} packed samples, "
                  f"{result.trajectories:,} trajectories")


@user_errors
def demo(
    out: Annotated[Path, typer.Option(help="Where the sample logs are (re)generated.")] = Path("sample_logs"),
    reports: Annotated[Path, typer.Option(help="Folder the demo report is written into (as OUT/demo/).")] = Path("reports"),
    db: DbOption = None,
) -> None:
    """The zero-setup tour: generate sample logs, ingest them, show what the store holds, write the demo report."""
    from polytrace_cli.bench.presets import PRESETS, preset
    from polytrace_cli.bench.synth import synthesize, with_overrides
    from polytrace_cli.ingest.runner import ingest_paths
    from polytrace_cli.store import open_store
    from polytrace_cli.store.queries import run_ids, runs_frame

    for task in PRESETS:
        model, spec = preset(task)
        synthesize(model, with_overrides(spec, seed=DEMO_SEED), out / task)
    con = open_store(db)
    names: list[str] = []
    try:
        for task in PRESETS:
            ingested = ingest_paths(con, [out / task], task=task)
            failed = [r for r in ingested if r.failed]
            if failed:
                raise fail(f"demo logs for {task} did not ingest: {failed[0].message}", 1)
            names.extend(run for run in dict.fromkeys(r.run for r in ingested if r.run) if run not in names)
        emit_frame(runs_frame(con), title="runs in the store")
        from polytrace_cli.report import write_report  # matplotlib loads only when a report is drawn

        try:
            index = write_report(con, run_ids(con, names), reports, "demo")
        except OSError as error:
            raise fail(f"cannot write the demo report under {reports}: {error.strerror or error}") from None
    finally:
        con.close()
    console.print(f"sample logs in {out}/; try `polytrace query \"select * from samples limit 5\"`")
    console.print("demo report written; open it in a browser:")
    typer.echo(str(index))
