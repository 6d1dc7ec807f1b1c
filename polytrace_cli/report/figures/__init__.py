"""Report figures F1–F12, one module each, in report order (table T1 is in `report.tables`)."""

from __future__ import annotations

import importlib
from types import ModuleType

FIGURE_MODULES = (
    "f01_length_cdf",
    "f02_response_by_step",
    "f03_prompt_vs_response",
    "f04_stage_breakdown",
    "f05_step_time",
    "f06_rank_imbalance",
    "f07_long_tail",
    "f08_tool_calls",
    "f09_reward_per_rank",
    "f10_dapo_filtering",
    "f11_step_vs_max_length",
    "f12_by_task",
    "f13_step_lanes",
)


def figure_modules() -> list[ModuleType]:
    """The figure modules, F1 first."""
    return [importlib.import_module(f"{__name__}.{name}") for name in FIGURE_MODULES]
