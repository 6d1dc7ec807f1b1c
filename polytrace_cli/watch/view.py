"""The terminal view of `polytrace watch`: the last steps with their stage bars (and a legend of their
colours), expected against actual, slow steps with their causes, throughput and the ETA to the configured
last step."""

from __future__ import annotations

import statistics

from rich.console import Group
from rich.table import Table
from rich.text import Text

# How many of the latest steps the view lists.
SHOWN_STEPS = 12
BAR_CHARS = 24
STAGE_STYLES = {"gen": "cyan", "reward": "yellow", "old_log_prob": "blue", "ref": "magenta", "values": "green",
                "adv": "white", "update_critic": "bright_green", "update_actor": "bright_blue",
                "update_weights": "bright_magenta", "testing": "red", "save_checkpoint": "bright_red",
                "trainer_wait": "bright_black", "switch": "bright_yellow"}


class WatchView:
    """Collects events and draws them (a rich renderable for `rich.live.Live`)."""

    def __init__(self, path: str):
        self.path = path
        self.total_steps: int | None = None
        self.steps: list[dict] = []
        self.alerts: list[dict] = []
        self.validation: dict | None = None
        self.run: str | None = None

    def add(self, event: dict) -> None:
        if event["event"] == "step":
            if event.get("corrected"):  # the step judged again: its row is replaced
                key = (event["segment"], event["step"])
                self.steps = [event if (s["segment"], s["step"]) == key else s for s in self.steps]
            else:
                self.steps.append(event)
        elif event["event"] in ("alert", "truncated"):
            self.alerts.append(event)
        elif event["event"] == "validation":
            self.validation = event

    def __rich__(self) -> Group:
        timed = [s["seconds"] for s in self.steps[-50:] if s.get("seconds")]
        per_step = statistics.median(timed) if timed else None
        last = self.steps[-1]["step"] if self.steps else None
        head = Text(f"watching {self.path}" + (f"  run {self.run}" if self.run else ""), style="bold")
        facts = [f"{len(self.steps)} steps seen"]
        if per_step:
            facts.append(f"{per_step:.1f} s/step (median of the last {len(timed)}), {3600 / per_step:.1f} steps/h")
        if per_step and self.total_steps and last is not None:
            left = max(self.total_steps - last, 0)
            facts.append(f"ETA to step {self.total_steps}: {_clock(left * per_step)}")
        table = Table(expand=False, pad_edge=False)
        for name, justify in (("step", "right"), ("seconds", "right"), ("expected", "right"), ("×", "right"),
                              ("stages", "left"), ("causes", "left")):
            table.add_column(name, justify=justify, no_wrap=name != "causes")
        longest = max((s["seconds"] or 0 for s in self.steps[-SHOWN_STEPS:]), default=0)
        for step in self.steps[-SHOWN_STEPS:]:
            seconds, expected = step.get("seconds"), step.get("expected_s")
            ratio = f"{seconds / expected:.2f}" if seconds and expected else "—"
            causes = ", ".join(f"{c['cause']} {c['seconds']:+.1f} s ({c['stage']})" for c in step["causes"])
            style = "bold red" if step["slow"] else None
            table.add_row(str(step["step"]), _seconds(seconds), _seconds(expected), ratio,
                          _bar(step.get("stages", {}), longest), causes or (step.get("note") or ""), style=style)
        parts = [head, Text("  ".join(facts))]
        if self.validation is not None:
            parts.append(Text(_validation_text(self.validation)))
        parts.append(table)
        legend = stage_legend(self.steps[-SHOWN_STEPS:])
        if legend.plain:
            parts.append(legend)
        for alert in self.alerts[-4:]:
            parts.append(Text(_alert_text(alert), style="yellow"))
        return Group(*parts)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _clock(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m"


def stage_legend(steps: list[dict]) -> Text:
    """What each colour of the stage bars is: the stages the shown steps draw, in the order they are drawn."""
    seen = list(dict.fromkeys(stage for step in steps for stage, seconds in step.get("stages", {}).items()
                              if seconds))
    legend = Text()
    if seen:
        legend.append("stages: ", style="dim")
    for index, stage in enumerate(seen):
        if index:
            legend.append("  ")
        legend.append("█", style=STAGE_STYLES.get(stage, "white"))
        legend.append(f" {stage}")
    return legend


def _bar(stages: dict, longest: float) -> Text:
    bar = Text()
    if not longest:
        return bar
    for stage, seconds in stages.items():
        width = round(BAR_CHARS * seconds / longest)
        if width:
            bar.append("█" * width, style=STAGE_STYLES.get(stage, "white"))
    return bar


# How many of a validation's values the view shows (in the order they were logged).
SHOWN_VALIDATION_VALUES = 3


def _validation_text(event: dict) -> str:
    values = list(event["metrics"].items())
    shown = ", ".join(f"{key} {'—' if value is None else f'{value:.4g}'}"
                      for key, value in values[:SHOWN_VALIDATION_VALUES])
    more = f" (+{len(values) - SHOWN_VALIDATION_VALUES} more)" if len(values) > SHOWN_VALIDATION_VALUES else ""
    return f"validation at step {event['step']}: {shown}{more}"


def _alert_text(alert: dict) -> str:
    if alert["event"] == "truncated":
        return f"file shrank to {alert['bytes']:,} bytes: read again whole"
    kind = alert["kind"]
    if kind == "slow_step_withdrawn":
        return (f"step {alert['step']} is not slow after all: {_seconds(alert['seconds'])} s once its metrics"
                " landed")
    if kind == "slow_step":
        causes = ", ".join(c["cause"] for c in alert["causes"]) or "no cause stands out"
        return f"slow step {alert['step']}: {alert['seconds']:.1f} s, expected {alert['expected_s']:.1f} s ({causes})"
    if kind == "stall":
        return (f"stall: no step since step {alert['step']} for {alert['seconds_since_step']:.0f} s"
                f" (usually {alert['usual_gap_s']:.1f} s between steps)")
    if kind == "crash":
        return f"crash ({alert['cause']}): {alert['reason']}"
    if kind == "async":
        return f"{alert['signal'].replace('_', ' ')} at step {alert['step']}: {alert['reason']}"
    if kind == "efficiency":
        return (f"efficiency at step {alert['step']}: {alert['stage']} {alert['direction']} than {alert['baseline']}'s "
                f"band at the same workload, {alert['seconds']:+.1f} s ({alert['share']:+.1%}, z {alert['z']:+.1f} "
                f"over {alert['steps']} steps)").replace("-", "−")
    return f"{kind}: {alert.get('reason', '')}"
