"""The top of a report, per run: where its typical step goes, what its numbers mean (the caveats), its
costs ranked, and what would help as one table; `html` and `markdown` draw it from the same `RunTop`.

What the page leaves out is counted, never lost: costs under `findings.ON_PAGE_SHARE` of the run (or past
the first `findings.SHOWN`) are counted in one line and kept in summary.json; policies that gave no
estimate, a saving under `help.ON_PAGE_SAVING` of the run or a cost are named in one folded line with
their reasons. A row's assumption and the model's notes are folded under it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polytrace_cli.display import duration
from polytrace_cli.report.findings import CAVEATS
from polytrace_cli.report.help import ON_PAGE_SAVING, backtest_sentence, policy_note

HELP_COLUMNS = ("policy", "saving", "±", "how sure", "why")
# The top is written to be read in about a minute: at most this many words per run are shown before a person
# opens a folded line (tests read the page and hold it to this).
TOP_WORDS_PER_RUN = 200


@dataclass
class HelpRow:
    """One row of a run's "what would help" table, its cells in HELP_COLUMNS order, and what is folded
    under it (the assumption and the model's note)."""

    cells: tuple[str, str, str, str, str]
    folded: str


@dataclass
class RunTop:
    """What the top of the page says about one run."""

    run: str
    typical: str | None
    caveats: list[str] = field(default_factory=list)
    costs: list[str] = field(default_factory=list)
    hidden_costs: int = 0
    rows: list[HelpRow] = field(default_factory=list)
    folded_title: str | None = None
    folded: list[str] = field(default_factory=list)
    backtest: str | None = None


def own_text(run: str, text: str) -> str:
    """A finding's or entry's sentence without the run name it opens with (the page names the run above)."""
    prefix = f"{run}: "
    text = text[len(prefix):] if text.startswith(prefix) else text
    return text[:1].upper() + text[1:]


def saving_cells(entry: dict) -> tuple[str, str]:
    """The saving as 'time (share of the run)' and its standard error, for a table cell."""
    seconds, share = entry.get("saving_s"), entry.get("saving")
    if seconds is None:
        return (f"{100 * share:.1f}%" if share is not None else "—"), "—"
    error = entry.get("saving_se_s")
    return f"{duration(seconds)} ({100 * (share or 0):.1f}%)", duration(error) if error else "0"


def _why(entry: dict) -> str:
    if entry.get("why"):
        return entry["why"]
    if entry["policy"] in ("rebalance-dp-ranks", "not-modelled"):
        return own_text(entry["run"], entry["text"])
    return policy_note(entry["policy"]).does


def _folded_reason(entry: dict) -> str:
    seconds, share = entry.get("saving_s"), entry.get("saving")
    if seconds is not None and share is not None and share >= ON_PAGE_SAVING:
        return f"{entry['policy']}: saves {saving_cells(entry)[0]} ± {saving_cells(entry)[1]} ({_why(entry)})"
    if seconds is None and entry["policy"] != "rebalance-dp-ranks":
        return f"{entry['policy']}: no estimate: {entry.get('reason') or 'the model cannot price it'}"
    if seconds is not None and seconds < 0:
        return f"{entry['policy']}: would cost {duration(-seconds)} ({100 * -(share or 0):.1f}%)"
    if entry["policy"] == "rebalance-dp-ranks":
        return f"{entry['policy']}: {own_text(entry['run'], entry['text'])}"
    reason = f" ({entry['reason']})" if entry.get("reason") else ""
    return f"{entry['policy']}: saves {saving_cells(entry)[0]}, under {100 * ON_PAGE_SAVING:.1f}% of the run{reason}"


def _row(entry: dict) -> HelpRow:
    saving, error = saving_cells(entry)
    folded = []
    if entry.get("assumption"):
        folded.append(f"Assumes {entry['assumption']}.")
    if entry.get("reason") and entry["policy"] != "rebalance-dp-ranks":
        folded.append(entry["reason"][:1].upper() + entry["reason"][1:] + ".")
    return HelpRow((entry["policy"], saving, error, entry.get("certainty") or "—", _why(entry)), " ".join(folded))


def run_tops(report) -> list[RunTop]:
    """Per run of the report, in report order, what the top of its page says (see the module docstring)."""
    tops = []
    for run in report.runs:
        typical = report.typical_steps.get(run)
        top = RunTop(run, typical["text"] if typical else None)
        for finding in (f for f in report.findings if f["run"] == run):
            if finding["cause"] in CAVEATS:
                top.caveats.append(own_text(run, finding["text"]))
            elif finding.get("on_page"):
                top.costs.append(own_text(run, finding["text"]))
            else:
                top.hidden_costs += 1
        entries = [h for h in report.help if h["run"] == run]
        top.rows = [_row(h) for h in entries if h.get("on_page")]
        folded = [h for h in entries if not h.get("on_page")]
        if folded:
            top.folded_title = folded_title(folded)
            top.folded = [_folded_reason(h) for h in folded]
        backtests = [h["backtest"] for h in entries if h.get("backtest")]
        if backtests:
            top.backtest = own_text(run, backtest_sentence(run, backtests[0]))
        tops.append(top)
    return tops


def folded_title(folded: list[dict]) -> str:
    """The one line naming the entries left out of a run's table, with how many of each kind."""
    none = sum(1 for h in folded if h.get("saving_s") is None and h["policy"] != "rebalance-dp-ranks")
    cost = sum(1 for h in folded if (h.get("saving_s") or 0) < 0)
    smaller = sum(1 for h in folded if (h.get("saving") or 0) >= ON_PAGE_SAVING)
    small = len(folded) - none - cost - smaller
    kinds = [f"{count} {what}" if len(folded) > 1 else what for count, what in (
        (smaller, "saved less"), (small, f"saved under {100 * ON_PAGE_SAVING:.1f}% of the run"),
        (none, "gave no estimate"), (cost, "would cost time")) if count]
    word = "policy" if len(folded) == 1 else "policies"
    return f"{len(folded)} more {word}: {', '.join(h['policy'] for h in folded)} ({', '.join(kinds)})"


def hidden_line(top: RunTop) -> str | None:
    """The line counting the costs the page leaves out (under ON_PAGE_SHARE of the run, or past the first
    SHOWN), or None."""
    if not top.hidden_costs:
        return None
    return f"{top.hidden_costs} smaller finding{'s' if top.hidden_costs != 1 else ''} in summary.json."
