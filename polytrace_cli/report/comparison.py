"""The report's comparison section: when a report holds several runs of one task, why each run's mean
step differs from the first run of that task (`diagnose.against.explain_against` over the report's
steps) and the verdict at the same workload (`diagnose.verdict.judge`: regression, improvement, no
change or inconclusive, as `check --baseline` gives it). Runs without a task are not compared: nothing
says they ran the same job; nor are runs that log no step metrics (per-sample traces alone: no step
time to compare). A pair is compared only when its runs match (`diagnose.comparable`: the same
framework, algorithm, estimator, model, GPU count and timed stages); a pair that does not, or whose
runs have too few timed steps in the range for a step-time model, is listed with the reason and no
numbers."""

from __future__ import annotations

from html import escape

import duckdb

from polytrace_cli.analyze.common import StepRange
from polytrace_cli.errors import PolytraceError

# Causes listed per pair on the page (every cause is in summary.json).
SHOWN_CAUSES = 3
COMPARISON_KEYS = ("task", "a", "b", "a_step_s", "b_step_s", "delta_s", "slowdown", "causes", "findings", "scaling",
                   "omitted", "verdict", "comparable", "stages")


def runs_by_task(con: duckdb.DuckDBPyConnection, run_ids: list[int]) -> dict[str, list[str]]:
    """Task -> the report's runs of that task that log step times (`model.logs_step_metrics`), in report
    order; only tasks with two or more such runs."""
    from polytrace_cli.model import logs_step_metrics

    rows = con.execute("SELECT run_id, name, task FROM runs WHERE run_id IN (SELECT unnest(?)) AND task IS NOT NULL",
                       [run_ids]).fetchall()
    order = {run_id: index for index, run_id in enumerate(run_ids)}
    grouped: dict[str, list[str]] = {}
    for run_id, name, task in sorted(rows, key=lambda row: order[row[0]]):
        if logs_step_metrics(con, run_id):
            grouped.setdefault(task, []).append(name)
    return {task: names for task, names in grouped.items() if len(names) > 1}


def run_comparisons(con: duckdb.DuckDBPyConnection, run_ids: list[int], steps: StepRange) -> list[dict]:
    """Per task with several runs, each later run against the task's first (`COMPARISON_KEYS`; causes
    and findings as `explain --against --json` has them, `verdict` as `check --json`'s
    `baseline.verdict`, `comparable` the guardrails, `omitted` the reason a pair has no numbers)."""
    from polytrace_cli.diagnose.against import explain_against
    from polytrace_cli.diagnose.verdict import judge

    out = []
    for task, names in runs_by_task(con, run_ids).items():
        baseline = names[0]
        for run in names[1:]:
            entry = dict.fromkeys(COMPARISON_KEYS)
            entry.update(task=task, a=baseline, b=run, causes=[], findings=[])
            try:
                comparison = explain_against(con, run, baseline, steps, steps)
            except PolytraceError as error:
                entry["omitted"] = str(error)
                entry["stages"] = across_frameworks(con, baseline, run, steps)
                out.append(entry)
                continue
            guard = comparison.comparability
            entry["comparable"] = None if guard is None else guard.to_dict()
            if guard is not None and not guard.comparable:
                entry["omitted"] = "the runs do not compare like for like: " + "; ".join(guard.reasons)
                entry["stages"] = across_frameworks(con, baseline, run, steps)
            else:
                document = comparison.to_dict()
                entry.update({key: document[key] for key in COMPARISON_KEYS if key in document})
                entry.update(task=task, a=baseline, b=run, verdict=judge(comparison).to_dict())
            out.append(entry)
    return out


def across_frameworks(con: duckdb.DuckDBPyConnection, run_a: str, run_b: str, steps: StepRange) -> list[dict] | None:
    """For two runs of different frameworks, each canonical stage either declares: its mean seconds in each
    run (`analyze.stages.stage_stats`, null where the run logs none) and what it holds in each framework
    (its `names.py`'s STAGE_MEANINGS, `no counterpart` where it has none); None for runs of one framework."""
    from polytrace_cli.analyze.stages import stage_stats
    from polytrace_cli.ingest.stage_meanings import stages_across
    from polytrace_cli.store.catalog import STEP_COLUMNS
    from polytrace_cli.store.queries import run_ids

    ids = run_ids(con, [run_a, run_b])
    frameworks = dict(con.execute("SELECT run_id, framework FROM runs WHERE list_contains(?, run_id)", [ids]).fetchall())
    pair = [frameworks.get(ids[0]), frameworks.get(ids[1])]
    if pair[0] == pair[1]:
        return None
    stats = stage_stats(con, ids, steps)
    means = {(row["run"], row["stage"]): row["mean_s"] for row in stats.iter_rows(named=True)}
    rows = []
    for stage, (meaning_a, meaning_b) in stages_across(pair, [c for c in STEP_COLUMNS if c.endswith("_s")]):
        name = stage.removesuffix("_s")
        rows.append({"stage": name, "a_mean_s": means.get((run_a, name)), "b_mean_s": means.get((run_b, name)),
                     "a_meaning": meaning_a, "b_meaning": meaning_b})
    return rows


def _stage_line(row: dict, entry: dict) -> str:
    def side(run: str, mean: float | None, meaning: str) -> str:
        seconds = "—" if mean is None else f"{mean:,.1f} s"
        return f"{run} {seconds} ({meaning})"

    return (f"{row['stage']}: " + side(entry["a"], row["a_mean_s"], row["a_meaning"]) + "; "
            + side(entry["b"], row["b_mean_s"], row["b_meaning"]))


def _cause_line(cause: dict) -> str:
    stage = f" ({cause['stage']})" if cause["stage"] else ""
    share = f", {cause['share']:.0%} of the difference" if cause["share"] is not None else ""
    return f"{cause['cause']}{stage} {cause['seconds']:+,.1f} s per step{share}"


def _lines(entry: dict) -> tuple[str, list[str]]:
    head = f"{entry['b']} against {entry['a']} (task {entry['task']})"
    if entry["omitted"]:
        stages = [f"across frameworks, the canonical stages: {_stage_line(row, entry)}" for row in entry.get("stages") or []]
        return head, [f"not compared: {entry['omitted']}", *stages]
    scaled = [text for text in entry["findings"] if "stopped scaling" in text]
    verdict = entry.get("verdict")
    judged = [f"verdict at the same workload: {verdict['headline']}", *(w["text"] for w in verdict["workload"])] \
        if verdict else []
    return head, [*judged, entry["findings"][0], *(_cause_line(c) for c in entry["causes"][:SHOWN_CAUSES]), *scaled]


def html_section(comparisons: list[dict]) -> str:
    """The section's HTML ('' when the report holds no two runs of one task)."""
    if not comparisons:
        return ""
    parts = ["<h2 id='comparison'>Runs of one task compared</h2>",
             "<p class='meta'>Each run's mean step against the first run of its task: the verdict at the same "
             "workload (polytrace check RUN --baseline FIRST) and the causes that sum to the difference "
             "(polytrace explain RUN --against FIRST). Runs that do not match (framework, algorithm, model, "
             "GPUs, timed stages) are listed with the reason, not compared.</p>"]
    for entry in comparisons:
        head, lines = _lines(entry)
        items = "".join(f"<li>{escape(line)}</li>" for line in lines)
        parts.append(f"<h3>{escape(head)}</h3><ul{' class=omitted' if entry['omitted'] else ''}>{items}</ul>")
    return "\n".join(parts)


def markdown_lines(comparisons: list[dict]) -> list[str]:
    """The section's Markdown lines (none when the report holds no two runs of one task)."""
    if not comparisons:
        return []
    out = ["## Runs of one task compared", "",
           "Each run's mean step against the first run of its task: the verdict at the same workload (polytrace "
           "check RUN --baseline FIRST) and the causes that sum to the difference (polytrace explain RUN --against "
           "FIRST). Runs that do not match (framework, algorithm, model, GPUs, timed stages) are listed with the "
           "reason, not compared.", ""]
    for entry in comparisons:
        head, lines = _lines(entry)
        out += [f"### {head}", "", *(f"- {line}" for line in lines), ""]
    return out
