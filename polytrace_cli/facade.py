"""`Store`: polytrace from Python (a notebook, a script) over the same library the CLI calls.

    from polytrace_cli import Store

    with Store.open("runs.duckdb") as store:
        store.ingest(["logs/run_a"], task="math")
        store.runs()                                  # polars DataFrame, as `polytrace runs`
        store.analyze("lengths", steps="10:50")       # as `polytrace analyze --only lengths`
        store.steps("run_a")                          # as `polytrace steps run_a`
        store.explain("run_a").findings               # as `polytrace explain run_a`
        store.whatif("run_a", ["balance"]).table()    # as `polytrace whatif run_a --policy balance`
        store.report(out="reports")                   # path of index.html, as `polytrace report`
        store.query("SELECT count(*) FROM samples")   # read-only SQL

This module imports nothing heavy: DuckDB, polars and the analyses load when a method needs them.

Adding a method is three lines (and a docstring): import one library function and call it with
the store's connection, the run ids and the step range, e.g.

    def stage_times(self, runs: Runs = None, steps: Steps = None) -> pl.DataFrame:
        from polytrace_cli.analyze.stages import per_step
        return per_step(self.connection, self.run_ids(runs), self.step_range(steps))
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from polytrace_cli.errors import PolytraceError

# How long a watch waits for another process to let go of the store before a poll writes.
WATCH_LEASE_WAIT_S = 60.0

if TYPE_CHECKING:
    import duckdb
    import polars as pl

    from polytrace_cli.analyze.common import StepRange
    from polytrace_cli.diagnose import Explanation
    from polytrace_cli.diagnose.against import Comparison
    from polytrace_cli.ingest.files import FileHashes
    from polytrace_cli.ingest.ray_engine import RaySettings
    from polytrace_cli.ingest.ledger import FileReport
    from polytrace_cli.simulate import BacktestResult, WhatIfResult
    from polytrace_cli.watch import WatchResult, WatchSettings

    Steps = StepRange | str | int | None

Runs = str | Iterable[str] | None


def _names(runs: Runs) -> list[str] | None:
    if runs is None:
        return None
    return [runs] if isinstance(runs, str) else list(runs)


class Store:
    """An open polytrace store (a DuckDB file). Open it with `Store.open`; close it with `close()`
    or a `with` block."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, path: Path, read_only: bool):
        self._connection: duckdb.DuckDBPyConnection | None = connection
        self.path = path
        self.read_only = read_only

    @classmethod
    def open(cls, path: str | Path | None = None, read_only: bool = False, wait: float = 0,
             upgrade: bool = True) -> Store:
        """Open (creating and migrating when needed) the store at `path`; by default, as the CLI,
        $POLYTRACE_DB or ./polytrace.duckdb. While another process holds it, retry for up to `wait`
        seconds; with upgrade=False, a read-only open of an older store is an error instead of an upgrade."""
        from polytrace_cli.ingest.registry import declared_metric_names
        from polytrace_cli.store import open_store, resolve_db_path

        resolved = resolve_db_path(path)
        connection = open_store(resolved, read_only=read_only, wait=wait, upgrade=upgrade,
                                metric_names=declared_metric_names)
        return cls(connection, resolved, read_only)

    @classmethod
    def write_report(cls, path: str | Path | None = None, runs: Runs = None, out: str | Path = "reports",
                     name: str | None = None, steps: Steps = None, svg: bool = False, wait: float = 0) -> Path:
        """`polytrace report`: the report of the runs of the store at `path`, opened read-only for it, with
        the modelled numbers computed in a second process opening the store on its own (when this process
        has opened no store yet); returns the path of index.html."""
        from polytrace_cli.report.store_report import write_forked_report
        from polytrace_cli.store.connection import connections_opened

        may_fork = not connections_opened()
        return write_forked_report(lambda upgrade: cls.open(path, read_only=True, wait=wait, upgrade=upgrade),
                                   _names(runs), out, name, steps, svg, may_fork=may_fork)

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The DuckDB connection the library functions take."""
        if self._connection is None:
            raise PolytraceError(f"the store {self.path} is closed")
        return self._connection

    def run_ids(self, runs: Runs = None) -> list[int]:
        """Ids of the named runs (every run when None); an unknown name is an error."""
        from polytrace_cli.store.queries import run_ids

        return run_ids(self.connection, _names(runs))

    @staticmethod
    def step_range(steps: Steps = None) -> StepRange:
        """A StepRange from "A:B", "A:", ":B", a step number, a StepRange or None (every step)."""
        from polytrace_cli.analyze.common import StepRange

        return StepRange.of(steps)

    @classmethod
    def ingest_into(cls, path: str | Path | None, paths: str | Path | Iterable[str | Path], run: str | None = None,
                    task: str | None = None, format: str | None = None, *, tokenizer: str | None = None,
                    hashes: FileHashes | None = None, wait: float = 0, ray: RaySettings | None = None,
                    progress: Callable[[int], Callable[[FileReport], None]] | None = None) -> list[FileReport]:
        """`polytrace ingest`: open (creating) the store at `path` and `ingest` into it. A tokenizer that cannot
        be loaded is an error before the store is touched. With `ray`, the Ray session is joined (or started,
        and ended afterwards) first, so a cluster that cannot be reached leaves no store; a failure of the Ray
        driver or a task is one line (the files committed before it stay). `progress(total bytes)` gives the
        callback that each file's report is passed to as it is done."""
        from polytrace_cli.ingest.base import load_tokenizer

        loaded = load_tokenizer(tokenizer) if tokenizer else None
        if ray is None:
            return cls._ingest_opened(path, paths, run, task, format, loaded, hashes, wait, None, progress)
        from polytrace_cli.ingest.ray_engine import ray_session

        with ray_session(ray):
            try:
                return cls._ingest_opened(path, paths, run, task, format, loaded, hashes, wait, ray, progress)
            except PolytraceError:
                raise
            except Exception as error:
                if cls.error_message(error) is not None or getattr(error, "errno", None) == errno.ENOSPC:
                    raise  # the store's and the full disk's own one-line errors
                text = str(error).strip()
                detail = f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
                raise PolytraceError(f"the Ray ingest failed: {detail}") from None

    @classmethod
    def _ingest_opened(cls, path, paths, run, task, format, tokenizer, hashes, wait, ray, progress) -> list[FileReport]:
        from polytrace_cli.ingest.files import walk

        with cls.open(path, wait=wait) as store:
            targets = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
            on_file = None
            if progress is not None:
                on_file = progress(sum(p.stat().st_size for p, _, problem in walk(targets) if not problem))
            return store.ingest(targets, run, task, format, tokenizer=tokenizer, on_file=on_file, hashes=hashes,
                                ray=ray)

    @staticmethod
    def error_message(error: BaseException) -> str | None:
        """The one line that tells a DuckDB error about the store file (a lock, damage, a full disk, a file
        that is not a store), or the first line of another DuckDB error; None for an error not DuckDB's."""
        import sys

        duckdb = sys.modules.get("duckdb")
        if duckdb is None or not isinstance(error, duckdb.Error):
            return None
        from polytrace_cli.store.connection import store_problem

        text = str(error).strip()
        return store_problem("the store", error) or (text.splitlines()[0] if text else type(error).__name__)

    def ingest(self, paths: str | Path | Iterable[str | Path], run: str | None = None, task: str | None = None,
               format: str | None = None, *, tokenizer: str | object | None = None,
               on_file: Callable[[FileReport], None] | None = None, hashes: FileHashes | None = None,
               ray: RaySettings | None = None) -> list[FileReport]:
        """Read files and folders into the store, one transaction per file, as `polytrace ingest`.
        Returns one report per file: path, run, format, status, lines, rows, ignored, rejected, ...
        `tokenizer`: a local Hugging Face tokenizer (its name or path, or the loaded tokenizer) that counts
        rollout-dump lengths for this ingest; `on_file`: called with each file's report as it is done;
        `hashes`: files' hashes already computed or computing; `ray`: parse on the Ray session these
        settings describe (`polytrace ingest --ray`)."""
        from polytrace_cli.ingest.base import counting_tokens_with, load_tokenizer

        if self.read_only:
            raise PolytraceError(f"the store {self.path} is open read-only; open it with read_only=False to ingest")
        targets = [Path(p) for p in ([paths] if isinstance(paths, (str, Path)) else paths)]
        loaded = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        options = {"run_name": run, "task": task, "format_name": format, "on_file": on_file, "hashes": hashes}
        with counting_tokens_with(loaded):
            if ray is None:
                from polytrace_cli.ingest.driver import ingest_paths

                return ingest_paths(self.connection, targets, **options)
            from polytrace_cli.ingest.ray_engine import ingest_paths_ray

            # Ray's workers load the tokenizer again, by the name or path it was loaded from.
            name = tokenizer if isinstance(tokenizer, str) else getattr(loaded, "name_or_path", None)
            return ingest_paths_ray(self.connection, targets, settings=ray, tokenizer=name, **options)

    def watch(self, path: str | Path, on_event: Callable[[dict], None], settings: WatchSettings | None = None,
              on_run: Callable[[str], None] | None = None, baseline: str | None = None,
              baseline_db: str | Path | None = None) -> WatchResult:
        """Follow a log (or a run folder) as the job writes it, as `polytrace watch`: ingest its complete new
        lines, judge each new step and call `on_event` with each event (step, alert, truncated); `on_run`
        gets the run's name once its first rows are stored. With `baseline` (a run of this store, or of
        the store or lake `baseline_db`), each stage's efficiency is also judged against that run's band
        (`efficiency` alerts). Returns when it stays idle `settings.idle_exit` seconds or a crash ends it."""
        from polytrace_cli.watch import WatchSettings, watch_log
        from polytrace_cli.watch.baseline import BaselineBand

        if self.read_only:
            raise PolytraceError(f"the store {self.path} is open read-only; open it with read_only=False to watch")
        band = None
        if baseline is not None and baseline_db is None:
            self.run_ids(baseline)
            band = BaselineBand.of_run(self.connection, baseline)
        elif baseline is not None:
            with Store.open(baseline_db, read_only=True) as other:
                other.run_ids(baseline)
                band = BaselineBand.of_run(other.connection, baseline)
        # The store is held only while a poll writes it: other commands (`runs --wait 30`) get through
        # between polls. Within a poll (and in `on_run`) this Store's connection is that poll's.
        self.connection.close()
        self._connection = None

        @contextmanager
        def held() -> Iterator[duckdb.DuckDBPyConnection]:
            from polytrace_cli.store import open_store

            from polytrace_cli.store.sandbox import trust_own_write

            self._connection = open_store(self.path, wait=WATCH_LEASE_WAIT_S)
            try:
                yield self._connection
            finally:
                self._connection.close()
                self._connection = None
                trust_own_write(self.path)

        try:
            return watch_log(held, Path(path), on_event, settings or WatchSettings(), on_run=on_run,
                             baseline=band)
        finally:
            from polytrace_cli.store import open_store

            self._connection = open_store(self.path, wait=WATCH_LEASE_WAIT_S)

    def configured_steps(self, run: str) -> int | None:
        """The run's configured last step (`total_training_steps` in its config), when it names one."""
        from polytrace_cli.watch.follow import configured_steps

        return configured_steps(self.connection, run)

    def runs(self) -> pl.DataFrame:
        """One row per run with its files, samples, steps and rejected lines, and `semantics` (a struct:
        what the run's numbers mean), as `polytrace runs --json`."""
        import polars as pl

        from polytrace_cli.analyze.semantics import SEMANTICS_COLUMNS, records_by_name
        from polytrace_cli.store.queries import runs_frame

        frame = runs_frame(self.connection)
        records = records_by_name(self.connection, self.run_ids())
        fields = pl.Struct({name: dtype for name, dtype in SEMANTICS_COLUMNS.items() if name != "run"})
        return frame.with_columns(pl.Series("semantics", [records.get(run) for run in frame["run"]], dtype=fields))

    def semantics(self, runs: Runs = None) -> pl.DataFrame:
        """What each run's numbers mean, one row per run (`analyze.semantics.SEMANTICS_COLUMNS`):
        step-time basis, balancing and the λ that sets time, responses per step and its source,
        samples by split, cut lines, crash, partial steps, length collapse; as the `semantics`
        object of `polytrace runs --json`."""
        from polytrace_cli.analyze.semantics import semantics

        return semantics(self.connection, self.run_ids(runs))

    def step_frame(self, runs: Runs = None, steps: Steps = None) -> pl.DataFrame:
        """The canonical per-step frame every view of step time and λ reads
        (`analyze.step_frame.STEP_FRAME_COLUMNS`)."""
        from polytrace_cli.analyze.step_frame import step_frame

        return step_frame(self.connection, self.run_ids(runs), self.step_range(steps))

    def analyze(self, name: str, runs: Runs = None, steps: Steps = None, split: str | None = None) -> pl.DataFrame:
        """The summary of one analysis (lengths, drift, longtail, fit, imbalance, stages, tools,
        filtering) over the runs, steps ("A:B", a step number or a StepRange) and split of the samples
        ("training", the default, or "validation": lengths, drift, longtail and fit only), as
        `polytrace analyze --only NAME --split SPLIT --json`."""
        from polytrace_cli.analyze.results import summaries

        return summaries(self.connection, _names(runs), name, steps, split)[name]

    def report(self, runs: Runs = None, out: str | Path = "reports", name: str | None = None,
               steps: Steps = None, svg: bool = False) -> Path:
        """Write the HTML report of the runs under `out/name/`, as `polytrace report` (each figure as
        PNG; as SVG too with `svg`, as `--svg`); returns the path of its index.html."""
        from polytrace_cli.report import write_runs_report

        return write_runs_report(self.connection, self.run_ids(runs), out, name, steps, svg=svg)

    def steps(self, run: str, steps: Steps = None) -> pl.DataFrame:
        """One row per step of the run (stage seconds, lengths, load balance, flags, the model's
        expected seconds and, on a slow step, its top cause), as `polytrace steps RUN --json`."""
        from polytrace_cli.diagnose.per_step import steps_with_causes

        return steps_with_causes(self.connection, self.run_ids(run), self.step_range(steps))

    def explain(self, run: str, step: int | None = None, top: int | None = None) -> Explanation:
        """Why the run's steps took their time: an `Explanation` (`.steps`, `.findings`, `.notes`;
        `.to_json()` is `polytrace explain RUN --json`)."""
        from polytrace_cli.diagnose import explain_run

        return explain_run(self.connection, run, step=step, top=top)

    def levers(self, run: str, top: int = 3) -> list[dict]:
        """The `top` policies that would save the run the most time, priced on its step-time model as the
        report's "what would help" prices them (`simulate.advice.levers`), as `polytrace explain` opens with."""
        from polytrace_cli.simulate.advice import levers

        return levers(self.connection, run, top)

    def explain_against(self, run: str, against: str | None = None, steps: Steps = None,
                        against_steps: Steps = None) -> Comparison:
        """Why the run's mean step (in `steps`) differs from `against`'s (in `against_steps`; the same
        run when None): a `Comparison` whose causes sum to `delta_s`; `.to_json()` is `polytrace
        explain RUN --against A --json`."""
        from polytrace_cli.diagnose.against import explain_against

        return explain_against(self.connection, run, against, self.step_range(steps), self.step_range(against_steps))

    def whatif(self, run: str, policies: str | Iterable[str] | None = None,
               backtest: bool = False, walk_forward: bool = False, training_scale: float | None = None,
               refit_every: int | None = None) -> WhatIfResult | BacktestResult:
        """The run's predicted wall time under the policies ("balance", "no-validation",
        "max-response-len=N", ...), a `WhatIfResult`; with backtest=True the model's accuracy on
        held-out steps, a `BacktestResult` (walk_forward=True adds the walk-forward accuracies, refitted
        every `refit_every` steps);
        training_scale is one-step-off's measured slowdown of the training stages (`--training-scale`).
        `.to_json()` is `polytrace whatif --json`'s text, `.to_dict()` its document."""
        from polytrace_cli.simulate import backtest_run, parse_policy, whatif_run

        chosen = _names(policies) or []
        if backtest == bool(chosen):
            raise PolytraceError("give either backtest=True or at least one policy")
        if backtest:
            return backtest_run(self.connection, run, walk_forward=walk_forward, refit_every=refit_every)
        return whatif_run(self.connection, run, [parse_policy(text) for text in chosen], training_scale)

    def forecast(self, run: str) -> dict[str, float]:
        """The next step's seconds per stage (and `step`, their sum) from the run's steps so far, at the
        recent workload: the step-time forecaster a live monitor calls after each step
        (`model.forecast_next`)."""
        from polytrace_cli.model import forecast_next, read_workload

        return forecast_next(read_workload(self.connection, run))

    def run_rows(self, with_semantics: bool = False) -> tuple[list[str], list[tuple]]:
        """The rows of `runs()` as column names and tuples, without loading polars (`polytrace runs`);
        with `with_semantics`, a last column `semantics` holds each run's record as JSON-ready values."""
        from polytrace_cli.store.queries import runs_rows

        columns, rows = runs_rows(self.connection)
        if not with_semantics:
            return columns, rows
        from polytrace_cli.analyze.semantics import records_by_name

        records = records_by_name(self.connection, self.run_ids())
        return [*columns, "semantics"], [(*row, records.get(row[0])) for row in rows]

    def summaries(self, runs: Runs = None, only: str | None = None, steps: Steps = None,
                  split: str | None = None) -> dict[str, pl.DataFrame]:
        """{analysis: summary} of the analyses named in `only` ("lengths,imbalance"; every one when None) over
        the runs and the split of their samples ("training", the default, or "validation", where only the
        analyses that read samples answer), as `polytrace analyze --json`. A store without runs is an
        error, and so is a validation split with nothing to analyze."""
        return self.summaries_with_notes(runs, only, steps, split)[0]

    def summaries_with_notes(self, runs: Runs = None, only: str | None = None, steps: Steps = None,
                             split: str | None = None) -> tuple[dict[str, pl.DataFrame], list[str]]:
        """`summaries` and what the split leaves out, one line each (analyses that do not apply to the
        validation split, runs without validation samples; none in the training split)."""
        from polytrace_cli.store.queries import run_ids_to_analyze

        step_range = self.step_range(steps).of_split(split)
        # The runs are resolved before polars and the analyses load: a mistyped name fails at once.
        ids = run_ids_to_analyze(self.connection, _names(runs))
        from polytrace_cli.analyze.results import run_analyses, select_analyses, split_notes

        analyses = select_analyses(only)
        notes = split_notes(self.connection, ids, list(analyses), step_range)
        return run_analyses(self.connection, ids, analyses, step_range), notes

    def by_group(self, by: str, runs: Runs = None, steps: Steps = None) -> pl.DataFrame:
        """One row per task (by="task") or model over the runs, as `polytrace analyze --by`."""
        from polytrace_cli.store.queries import run_ids_to_analyze

        step_range = self.step_range(steps)
        ids = run_ids_to_analyze(self.connection, _names(runs))
        from polytrace_cli.analyze.fleet import by_group

        return by_group(self.connection, ids, by, step_range)

    def compare(self, run_a: str, run_b: str, only: str | None = None, steps: Steps = None) -> pl.DataFrame:
        """Every summary number of the two runs side by side with run_b − run_a, as `polytrace compare`."""
        from polytrace_cli.analyze.results import compare_frame

        if run_a == run_b:
            raise PolytraceError("compare needs two different runs")
        return compare_frame(run_a, run_b, self.summaries([run_a, run_b], only, steps))

    def comparability(self, run_a: str, run_b: str, steps: Steps = None):
        """Whether run_b compares with run_a like for like (framework, algorithm, estimator, model, GPUs,
        timed stages): a `diagnose.comparable.Comparability` (`.comparable`, `.reasons`), as `polytrace
        compare` states it."""
        from polytrace_cli.diagnose.comparable import runs_comparability

        self.run_ids([run_a, run_b])
        return runs_comparability(self.connection, run_a, run_b, self.step_range(steps))
    def stage_meanings(self, runs: Runs = None) -> pl.DataFrame:
        """What each canonical stage holds in each run's framework (`no counterpart` where it has none),
        one row per stage some framework of the runs declares, one column per run."""
        from polytrace_cli.ingest.stage_meanings import stage_meanings_frame

        return stage_meanings_frame(self.connection, self.run_ids(runs))

    def has_step_data(self, run: str, steps: Steps = None) -> bool:
        """Whether the run holds any data (samples or step metrics) in the step range."""
        from polytrace_cli.check import has_step_data

        (run_id,) = self.run_ids(run)
        return has_step_data(self.connection, run_id, self.step_range(steps))

    def crash_clause(self, run: str) -> str:
        """What a refusal for lack of steps adds about how the run ended (the crash ingest recorded)."""
        from polytrace_cli.analyze.semantics import crash_clause

        return crash_clause(self.connection, self.run_ids(run)[0])

    def check(self, run: str, limits: dict[str, float], steps: Steps = None) -> list:
        """Each threshold ({"max_imbalance": 1.2, ...}) against the run's measured value: a list of verdicts
        (`.as_dict()`), as `polytrace check`."""
        from polytrace_cli.check import check_run, validate_limits

        validate_limits(limits)
        (run_id,) = self.run_ids(run)
        return check_run(self.connection, run_id, run, limits, self.step_range(steps))

    def check_baseline(self, run: str, baseline: str | None = None, max_slowdown: float | None = None,
                       max_step_slowdown: float | None = None, steps: Steps = None, baseline_steps: Steps = None,
                       baseline_db: str | Path | None = None) -> tuple[list, dict]:
        """The run (in `steps`) against `baseline` (in `baseline_steps`; the run itself when None), read from
        the store or lake `baseline_db` when given: the verdicts of `max_slowdown` (efficiency at the same
        workload; 0.05 = 5%) and `max_step_slowdown` (the raw mean step) and the headline with the
        efficiency verdict (regression, improvement, no change, inconclusive), as `polytrace check RUN
        --baseline A`."""
        from polytrace_cli.check import check_baseline

        self.run_ids(run)
        if baseline_db is None:
            if baseline is not None:
                self.run_ids(baseline)
            return check_baseline(self.connection, run, baseline, max_slowdown, max_step_slowdown,
                                  self.step_range(steps), self.step_range(baseline_steps))
        with Store.open(baseline_db, read_only=True) as other:
            other.run_ids(baseline or run)
            return check_baseline(self.connection, run, baseline, max_slowdown, max_step_slowdown,
                                  self.step_range(steps), self.step_range(baseline_steps), other.connection)

    def errors(self, run: str | None = None, limit: int = 1000) -> pl.DataFrame:
        """Quarantined lines (run, file, line, code, reason, raw), at most `limit`, as `polytrace errors`."""
        from polytrace_cli.store.queries import ingest_errors_frame

        return ingest_errors_frame(self.connection, run, limit)

    def errors_count(self, run: str | None = None) -> int:
        """How many lines the store (or the run) quarantined."""
        from polytrace_cli.store.queries import ingest_errors_count

        return ingest_errors_count(self.connection, run)

    def remove(self, runs: str | Iterable[str]) -> list:
        """Remove the runs and every row they hold, in one transaction, as `polytrace rm`; one result per run
        (`.name`, `.rows` by table)."""
        from polytrace_cli.store.runs import remove_runs

        return remove_runs(self.connection, list(dict.fromkeys(_names(runs) or [])))

    def rename(self, old: str, new: str) -> None:
        """Give a run a new name, as `polytrace rename`."""
        from polytrace_cli.store.runs import rename_run

        rename_run(self.connection, old, new)

    def write_lake(self, out: str | Path, runs: Runs = None, prune: bool = False):
        """Write the store (or the runs) as a Parquet lake under `out`, as `polytrace lake`."""
        from polytrace_cli.store.lake import write_lake

        return write_lake(self.connection, out, _names(runs), prune=prune)

    def fit_lengths(self, run: str) -> dict:
        """The run's fitted prompt and response length distributions, a polytrace-params/1 document, as
        `polytrace fit --json`."""
        from polytrace_cli.store.queries import run_id
        from polytrace_cli.workload.fidelity import fitted_params

        return fitted_params(self.connection, run_id(self.connection, run))

    def fidelity(self, run: str, params: dict | None = None, seed: int = 0,
                 samplers: tuple[str, ...] = ("parametric", "empirical")) -> pl.DataFrame:
        """KS and mean/p50/p99/clip errors of a synthetic workload drawn from the run's fit (or `params`)
        against the run, as `polytrace fidelity`."""
        from polytrace_cli.store.queries import run_id as queries_run_id
        from polytrace_cli.workload.fidelity import fidelity, fitted_params

        run_id = queries_run_id(self.connection, run)
        document = params if params is not None else fitted_params(self.connection, run_id)
        return fidelity(self.connection, run_id, document, seed=seed, samplers=samplers)

    def workload_of(self, run: str, sampler: str = "parametric", task: str | None = None):
        """(length model, workload spec) shaped like the run, for `polytrace synth --from-run`."""
        from polytrace_cli.workload.fidelity import workload_from_run

        return workload_from_run(self.connection, run, sampler=sampler, task=task)

    def export(self, run: str, out: str | Path, formats: Iterable[str] = ("polytrace-json",)):
        """Write the run's samples as PolyTrace traces under `out`, as `polytrace export`."""
        from polytrace_cli.workload.export import export_run

        return export_run(self.connection, run, Path(out), list(formats))

    def spans(self, runs: Runs = None, steps: Steps = None) -> pl.DataFrame:
        """Every span of the runs, read from trace files or synthesized from stage timers (`synthesized`)."""
        from polytrace_cli.analyze.timeline import run_spans

        return run_spans(self.connection, self.run_ids(runs), self.step_range(steps))

    def timeline(self, runs: Runs = None, steps: Steps = None) -> pl.DataFrame:
        """Per step: bubbles, the straggler rank and stage, rollout/training overlap, the critical path."""
        from polytrace_cli.analyze.timeline import per_step

        return per_step(self.connection, self.run_ids(runs), self.step_range(steps))

    def export_timeline(self, run: str, output: str | Path, steps: Steps = None):
        """Write the run's spans (read, or synthesized from its stage timers) as a Chrome trace-event file
        for Perfetto, as `polytrace export --format chrome-trace`."""
        from polytrace_cli.workload.chrome_trace import export_chrome_trace

        return export_chrome_trace(self.connection, run, Path(output), self.step_range(steps))

    def replay_check(self, benchmark: str | Path, formal: str | Path):
        """A benchmark replay's per-stage error against the formal run (logs ingested into this store, or run
        names), as `polytrace replay-check`."""
        from polytrace_cli.workload.replay import replay_check

        return replay_check(self.connection, benchmark, formal)

    def confined(self, memory_limit: str | None = None) -> Store:
        """This store with its connection locked to it: no file read or written, no extension loaded, as
        `polytrace query` runs SQL; with `memory_limit` (DuckDB's spelling, '4GB'), its queries hold at
        most that much memory and spill nothing to disk. Returns the store."""
        from polytrace_cli.store.sql import confine

        confine(self.connection, memory_limit=memory_limit)
        return self

    def time_limit(self, seconds: float | None):
        """A context within which the store's queries are stopped after `seconds` (None: no limit),
        then raise PolytraceError saying so."""
        from polytrace_cli.store.sql import time_limit

        return time_limit(self.connection, seconds)

    def query_relation(self, sql: str) -> duckdb.DuckDBPyRelation:
        """The relation of one read-only statement (SELECT or EXPLAIN), without loading polars."""
        from polytrace_cli.store.queries import read_only_relation

        return read_only_relation(self.connection, sql)

    def query(self, sql: str) -> pl.DataFrame:
        """The rows of read-only SQL over the store's tables and views, as `polytrace query`."""
        from polytrace_cli.store.queries import query_frame

        return query_frame(self.connection, sql)

    def close(self) -> None:
        """Close the connection (closing twice is harmless). A store this process wrote is taken, as it
        leaves it, to hold only polytrace's own views (`sandbox.trust_own_write`): opening it again
        unchanged skips that check."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
            if not self.read_only:
                from polytrace_cli.store.sandbox import trust_own_write

                trust_own_write(self.path)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._connection is None else ("read-only" if self.read_only else "open")
        return f"Store({str(self.path)!r}, {state})"
