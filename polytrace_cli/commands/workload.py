"""Benchmark workloads: `polytrace synth`, `demo`, `fit`, `export`, `replay-check` and `fidelity`."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from polytrace_cli.commands.common import (RUNS_ORDER, CsvOption, DbOption, JsonOption, WaitOption, console, emit_frame,
                                          fail, json_default, user_errors)
from polytrace_cli.errors import PolytraceError

if TYPE_CHECKING:
    import polars as pl

DEMO_SEED = 2509



@user_errors
def synth(
    out: Annotated[Path, typer.Option(help="Folder to write the traces into.")],
    task: Annotated[str | None, typer.Option(help="Task label; without --params or --from-run, a built-in preset: math, code, search; with the published --params file: math or tool.")] = None,
    params: Annotated[Path | None, typer.Option(help="Parameters file: polytrace-params/1 or the published PolyTrace file.")] = None,
    from_run: Annotated[str | None, typer.Option(help="Fit this run of the store and sample from it, in its shape.")] = None,
    sampler: Annotated[str, typer.Option(help="parametric (fits) or empirical (stored quantiles).")] = "parametric",
    num_steps: Annotated[int | None, typer.Option("--num-steps", help="How many workload steps to write.")] = None,
    batch: Annotated[int | None, typer.Option(help="Prompts per step.")] = None,
    n: Annotated[int | None, typer.Option(help="Responses per prompt.")] = None,
    dp_ranks: Annotated[int | None, typer.Option(help="Data-parallel ranks.")] = None,
    max_response_len: Annotated[int | None, typer.Option(help="Length cap: longer responses are clipped to it.")] = None,
    drift: Annotated[float | None, typer.Option(help="Relative change of response length per step, e.g. 0.005.")] = None,
    multiturn: Annotated[bool | None, typer.Option(help="Write multi-turn trajectories instead of packed lengths.")] = None,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed writes the same files.")] = 0,
    log_format: Annotated[str, typer.Option("--format", help="polytrace (workload traces), verl-console (train.log) or verl-jsonl (metrics.jsonl, the file logger).")] = "polytrace",
    validate_every: Annotated[int | None, typer.Option(help="verl logs: validate every K steps (and on the last step).")] = None,
    checkpoint_every: Annotated[int | None, typer.Option(help="verl logs: save a checkpoint every K steps (and on the last step).")] = None,
    inject: Annotated[list[str] | None, typer.Option(help="verl logs: STEP:CAUSE[:SIZE], repeatable; causes: long_tail, token_volume, dp_imbalance, validation, checkpoint, weight_sync, warmup, unexplained.")] = None,
    verl_version: Annotated[str, typer.Option(help="verl logs: 0.4 (values printed .3f), 0.5 (reprs) or 0.8 (reprs; timing_s/step without testing and checkpoint).")] = "0.5",
    truth: Annotated[Path | None, typer.Option(help="verl logs: also write the true per-step model here (.json, or .csv for the per-step table).")] = None,
    resume_after: Annotated[int | None, typer.Option(help="verl logs: the job stops after a checkpoint at this step and resumes from it (warm-up again).")] = None,
    balance_batch: Annotated[bool, typer.Option("--balance-batch", help="verl logs: trainer.balance_batch=True, the training stages follow the busiest rank after balancing.")] = False,
    response_scale: Annotated[float | None, typer.Option(help="verl logs: every response of every step × this, clipped at the cap.")] = None,
    imbalance: Annotated[float | None, typer.Option(help="verl logs: every step's busiest DP rank holds this × the mean rank's tokens.")] = None,
    mode: Annotated[str | None, typer.Option(help="verl logs: execution mode, sync (colocated), one-step-off, fully-async or separate-async (a rollout pipeline and a trainer joined by a bounded queue).")] = None,
    rollout_gpu_share: Annotated[float | None, typer.Option(help="verl logs, asynchronous modes: the rollout's share of the GPUs (default 0.5).")] = None,
    staleness_limit: Annotated[int | None, typer.Option(help="verl logs, fully-async and separate-async: model versions a batch may lag (default 1).")] = None,
    switch_s: Annotated[float | None, typer.Option(help="verl logs, separate-async: seconds per step of the hybrid GPUs' switch to rollout.")] = None,
    db: DbOption = None,
    wait: WaitOption = 0,
    old_steps: Annotated[str | None, typer.Option("--steps", hidden=True)] = None,
) -> None:
    """Sample a workload from fitted distributions and write it as PolyTrace traces or as verl logs from a known step-time model."""
    from polytrace_cli.workload.distributions import load_params
    from polytrace_cli.facade import Store
    from polytrace_cli.workload.presets import PRESETS, preset
    from polytrace_cli.workload.synth import WorkloadSpec, synthesize, with_overrides

    if old_steps is not None:
        raise PolytraceError(f"synth counts steps with --num-steps {old_steps}; --steps is a step range A:B elsewhere")
    if params is not None and from_run is not None:
        raise fail("give either --params or --from-run, not both")
    if from_run is not None:
        with Store.open(db, read_only=True, wait=wait) as store:
            model, base = store.workload_of(from_run, sampler=sampler, task=task)
    elif task is None:
        raise fail("--task is needed without --params or --from-run (presets: " + ", ".join(PRESETS) + ")")
    elif params is not None:
        model = load_params(params, task=task, sampler=sampler)
        base = WorkloadSpec(task=task, n=model.n_sampling or 8, dp_ranks=model.dp_ranks or 2,
                            max_response_len=model.max_response_len, multiturn=bool(model.multiturn))
    else:
        model, base = preset(task)
    spec = with_overrides(base, steps=num_steps, batch=batch, n=n, dp_ranks=dp_ranks, max_response_len=max_response_len,
                          drift=drift, multiturn=multiturn, seed=seed)
    if log_format != "polytrace":
        from polytrace_cli.workload.steplog import LOG_FORMATS, VERL_VERSIONS, StepTimeModel, parse_injection, write_step_log

        if log_format not in LOG_FORMATS:
            raise fail(f"--format takes polytrace, {', '.join(LOG_FORMATS)}, not {log_format!r}")
        if verl_version not in VERL_VERSIONS:
            raise fail(f"--verl-version takes {', '.join(VERL_VERSIONS)}, not {verl_version!r}")
        style, includes_overheads = VERL_VERSIONS[verl_version]
        step_model = StepTimeModel(validate_every=validate_every, checkpoint_every=checkpoint_every,
                                   step_includes_overheads=includes_overheads, resume_after=resume_after,
                                   balance_batch=balance_batch,
                                   response_scale=1.0 if response_scale is None else response_scale,
                                   imbalance=imbalance,
                                   injections=tuple(parse_injection(text) for text in inject or []),
                                   mode=mode or "sync",
                                   rollout_gpu_share=0.5 if rollout_gpu_share is None else rollout_gpu_share,
                                   staleness_limit=1 if staleness_limit is None else staleness_limit,
                                   switch_s=switch_s)
        written = write_step_log(model, spec, step_model, out, (log_format,), style=style, truth=truth)
        console.print(f"wrote {', '.join(str(p) for p in written.files)}: {written.steps} steps of verl "
                      f"{verl_version} logs", highlight=False)
        for note in written.notes:
            console.print(f"note: {note}", highlight=False, markup=False)
        return
    verl_only = [name for name, value in (("--validate-every", validate_every), ("--checkpoint-every", checkpoint_every),
                                          ("--inject", inject), ("--truth", truth),
                                          ("--resume-after", resume_after), ("--response-scale", response_scale),
                                          ("--imbalance", imbalance), ("--balance-batch", balance_batch),
                                          ("--mode", mode), ("--rollout-gpu-share", rollout_gpu_share),
                                          ("--staleness-limit", staleness_limit), ("--switch-s", switch_s)) if value]
    if verl_only:
        raise fail(f"{verl_only[0]} applies to verl logs: add --format verl-console or --format verl-jsonl")
    result = synthesize(model, spec, out)
    console.print(f"wrote {len(result.files)} file(s) to {out}: {result.samples:,} packed samples, "
                  f"{result.trajectories:,} trajectories", markup=False)


@user_errors
def demo(
    out: Annotated[Path, typer.Option(help="Where the sample logs are (re)generated.")] = Path("sample_logs"),
    reports: Annotated[Path, typer.Option(help="Folder the demo report is written into (as OUT/demo/).")] = Path("reports"),
    db: Annotated[Path | None, typer.Option("--db", help="Store to ingest into (default: OUT/demo.duckdb, its own).")] = None,
    wait: WaitOption = 0,
) -> None:
    """The zero-setup tour: generate sample logs, ingest them into their own store (OUT/demo.duckdb), show what it
    holds, write the demo report."""
    from polytrace_cli.workload.presets import PRESETS, VERL_DEMO_RUN, preset, verl_demo
    from polytrace_cli.workload.steplog import write_step_log
    from polytrace_cli.workload.synth import synthesize, with_overrides
    from polytrace_cli.facade import Store

    for task in PRESETS:
        model, spec = preset(task)
        synthesize(model, with_overrides(spec, seed=DEMO_SEED), out / task)
    lengths, spec, step_model = verl_demo()
    write_step_log(lengths, with_overrides(spec, seed=DEMO_SEED), step_model, out / VERL_DEMO_RUN, ("verl-console",))
    # The demo's runs never mix with the user's: its store sits beside the sample logs unless --db names one.
    db = db or out / "demo.duckdb"
    names: list[str] = []
    with Store.open(db, wait=wait) as store:
        for folder, task in [*((task, task) for task in PRESETS), (VERL_DEMO_RUN, spec.task)]:
            ingested = store.ingest([out / folder], task=task)
            failed = [r for r in ingested if r.failed]
            if failed:
                raise fail(f"demo logs for {folder} did not ingest: {failed[0].message}", 1)
            names.extend(run for run in dict.fromkeys(r.run for r in ingested if r.run) if run not in names)
        # The table `polytrace runs` prints: each run's semantics record is for scripts (`runs --json`).
        shown = store.runs().drop("semantics", strict=False)
        if "missing_steps" in shown.columns and not (shown["missing_steps"].fill_null(0) > 0).any():
            shown = shown.drop("missing_steps")  # the holes are a column only when some run has them
        emit_frame(shown, title="runs in the store", identity=["run"], order=RUNS_ORDER)
        index = store.report(names, reports, "demo")  # matplotlib loads only when a report is drawn
    console.print(f"sample logs in {out}/, store {db}; try `polytrace steps {VERL_DEMO_RUN} --db {db}`",
                  highlight=False, markup=False)
    console.print("demo report written; open it in a browser:")
    typer.echo(str(index))


SAMPLERS = ("parametric", "empirical")


def _candidates_frame(document: dict) -> pl.DataFrame:
    """Candidates per kind; `best` marks the lowest AIC, `sampled` the scipy family the sampler draws from."""
    import polars as pl

    rows = []
    for kind in ("prompt", "response"):
        sampled = (document.get(kind) or {}).get("family")
        fitted = (document.get("candidates") or {}).get(kind) or []
        scored = [c.get("aic") for c in fitted if c.get("aic") is not None]
        lowest = min(scored) if scored else None
        for candidate in fitted:
            rows.append({
                "kind": kind, "family": candidate.get("family"),
                "KS": candidate.get("ks"), "AIC": candidate.get("aic"),
                "best": "*" if lowest is not None and candidate.get("aic") == lowest else "",
                "sampled": "*" if candidate.get("family") == sampled else "",
            })
    return pl.DataFrame(rows, schema={"kind": pl.String, "family": pl.String,
                                      "KS": pl.Float64, "AIC": pl.Float64, "best": pl.String, "sampled": pl.String})


@user_errors
def fit(
    run: Annotated[str, typer.Argument(help="Run to fit (see `polytrace runs`).")],
    task: Annotated[str | None, typer.Option(help="Task label written into the parameters file.")] = None,
    output: Annotated[Path | None, typer.Option("--output", help="Parameters file to write (default: OUT/<run>.params.json).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder to write <run>.params.json into (default: .).")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wait: WaitOption = 0,
) -> None:
    """Fit prompt and response length distributions of a run and write a polytrace-params/1 file.
    The table shows each candidate's family, KS and AIC; the fitted parameters are in the file and in --json."""
    from polytrace_cli.facade import Store

    if output is not None and out is not None:
        raise PolytraceError("give either --output FILE or --out FOLDER, not both")
    if out is not None and (out.suffix == ".json" or out.is_file()):
        raise PolytraceError(f"--out is a folder; write the parameters file with --output {out}")
    if as_json and as_csv:
        raise PolytraceError("choose one of --json and --csv")
    with Store.open(db, read_only=True, wait=wait) as store:
        document = store.fit_lengths(run)
    if task:
        document["task"] = task
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise PolytraceError(f"cannot create folder {out}: {error.strerror or error}") from None
    path = output or (out or Path()) / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', run)}.params.json"
    if path.parent and not path.parent.exists():
        raise PolytraceError(f"cannot write {path}: folder {path.parent} does not exist")
    path.write_text(json.dumps(document, indent=2, default=json_default) + "\n", encoding="utf-8")
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2, default=json_default) + "\n")
        return
    if as_csv:
        emit_frame(_candidates_frame(document), as_csv=True)
        return
    emit_frame(_candidates_frame(document), identity=["kind", "family"], title=f"fits for {run} (best: lowest AIC; sampled: the scipy family synth draws from)")
    for note in document.get("notes") or []:
        console.print(f"note: {note}", highlight=False, markup=False)
    console.print(f"wrote {path}", markup=False)


@user_errors
def export(
    run: Annotated[str, typer.Argument(help="Run to export.")],
    out: Annotated[Path | None, typer.Option(help="Folder to write the PolyTrace traces into (created if needed).")] = None,
    format: Annotated[list[str], typer.Option("--format", help="polytrace-json or packed (give twice for both), into --out; or chrome-trace, the run's timeline for Perfetto, into --output.")] = ["polytrace-json"],  # noqa: B006
    output: Annotated[Path | None, typer.Option(help="File to write the chrome-trace timeline into.")] = None,
    steps: Annotated[str | None, typer.Option(help="Steps of the timeline to export, A:B (chrome-trace).")] = None,
    db: DbOption = None,
    wait: WaitOption = 0,
) -> None:
    """Write a run's samples as PolyTrace traces (dataset JSON, packed_lengths_step_N.jsonl), or its timeline as a Chrome trace for Perfetto."""
    from polytrace_cli.facade import Store

    if "chrome-trace" in format:
        if len(set(format)) > 1:
            raise PolytraceError("--format chrome-trace writes one file (--output): export it apart from the PolyTrace formats")
        if output is None:
            raise PolytraceError("--format chrome-trace needs --output FILE (the timeline is one file)")
        with Store.open(db, read_only=True, wait=wait) as store:
            timeline = store.export_timeline(run, output, steps)
        kind = "synthesized from stage timers" if timeline.synthesized else "read from traces"
        console.print(f"wrote {timeline.path}: {timeline.spans:,} spans ({kind}) over {timeline.steps:,} steps, "
                      f"{timeline.events:,} events; open it at https://ui.perfetto.dev", markup=False)
        return
    if output is not None or steps is not None:
        raise PolytraceError("--output and --steps go with --format chrome-trace; the PolyTrace formats write into --out")
    if out is None:
        raise PolytraceError("--out FOLDER is needed for the PolyTrace formats")
    with Store.open(db, read_only=True, wait=wait) as store:
        result = store.export(run, out, format)
    shape = "multi-turn" if result.multiturn else "single-turn"
    console.print(f"wrote {len(result.files)} file(s) to {out}: {result.steps} steps, "
                  f"{result.samples:,} {'trajectories' if result.multiturn else 'samples'} ({shape})", markup=False)


@user_errors
def replay_check(
    benchmark: Annotated[str, typer.Option(help="Log (file or folder) of the benchmark replay, or a run name.")],
    formal: Annotated[str, typer.Option(help="Log (file or folder) of the formal training run, or a run name.")],
    db: Annotated[Path | None, typer.Option("--db", help="Ingest into this store (default: a temporary one).")] = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wait: WaitOption = 0,
) -> None:
    """Compare a benchmark replay with the formal run: per-stage error (benchmark − formal)/formal and accuracy."""
    import polars as pl

    from polytrace_cli.facade import Store

    with tempfile.TemporaryDirectory(prefix="polytrace-replay-") as folder:
        with Store.open(db or Path(folder) / "replay.duckdb", wait=wait) as store:
            report = store.replay_check(benchmark, formal)
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=json_default) + "\n")
        return
    if as_csv:
        emit_frame(report.per_stage, as_csv=True)
        return
    shown = report.per_stage.with_columns(
        (pl.col(c) * 100).round(2) for c in ("mean_error", "mean_abs_error", "max_abs_error")
    ).rename({"mean_error": "mean_error_%", "mean_abs_error": "mean_abs_error_%", "max_abs_error": "max_abs_error_%"})
    emit_frame(shown, title=f"replay {report.benchmark_run} vs formal {report.formal_run}")
    console.print(f"paired steps: {len(report.paired_steps)}; only in benchmark: {_steps(report.only_benchmark)}; "
                  f"only in formal: {_steps(report.only_formal)}; segments: {report.segments}", highlight=False)
    if report.accuracy_pct is None:
        console.print("no stage could be compared: the logs share no timed step")
    else:
        console.print(f"[bold]accuracy: {report.accuracy_pct:.1f}%[/] (100% − mean |error|, averaged over stages)")


def _steps(steps: list[int], limit: int = 10) -> str:
    if not steps:
        return "none"
    return ", ".join(map(str, steps[:limit])) + (f" ... ({len(steps)} in all)" if len(steps) > limit else "")


@user_errors
def fidelity(
    run: Annotated[str, typer.Argument(help="Run to compare its synthetic workload with.")],
    params: Annotated[Path | None, typer.Option(help="polytrace-params/1 file (default: fit the run now).")] = None,
    sampler: Annotated[str, typer.Option(help="parametric, empirical or both.")] = "both",
    seed: Annotated[int, typer.Option(help="Seed of the synthetic workload.")] = 0,
    db: DbOption = None,
    as_json: JsonOption = False,
    as_csv: CsvOption = False,
    wait: WaitOption = 0,
) -> None:
    """Synthesize a workload shaped like the run from its fit and report KS and mean/p50/p99/clip errors."""
    from polytrace_cli.facade import Store
    from polytrace_cli.workload.fidelity import KS_TARGET, P99_TARGET, read_params

    if sampler not in (*SAMPLERS, "both"):
        raise PolytraceError(f"--sampler takes parametric, empirical or both, not {sampler!r}")
    with Store.open(db, read_only=True, wait=wait) as store:
        frame = store.fidelity(run, read_params(params) if params else None, seed=seed,
                               samplers=SAMPLERS if sampler == "both" else (sampler,))
    if as_json or as_csv:
        emit_frame(frame, as_json=as_json, as_csv=as_csv)
        return
    columns = ["sampler", "draw", "kind", "n_run", "n_synth", "ks", "ks_noise", "mean_error", "p50_error",
               "p99_error", "clip_run", "clip_synth", "pass"]
    # A narrow table keeps which draw passed, then the errors that decide it, then the counts.
    emit_frame(frame.select(columns), identity=("sampler", "draw", "kind", "pass"),
               order=("ks", "p99_error", "ks_noise", "mean_error", "p50_error", "clip_run", "clip_synth", "n_run",
                      "n_synth"), title=f"fidelity of {run} (targets: KS <= {KS_TARGET}, |p99 error| <= "
                                            f"{P99_TARGET:.0%}; errors are (synth − run)/run)")
    if (frame["ks_noise"] > KS_TARGET).any():
        console.print("note: where ks_noise > 0.05 the run has too few lengths to show KS <= 0.05 even for a "
                      "perfect model")
