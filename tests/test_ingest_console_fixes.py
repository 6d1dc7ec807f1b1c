"""Real console logs read right: repeated steps, old and new stage keys, validation keys, run meta
from the printed config, and text hygiene. Each case has a small fixture with hand-known truth."""

from __future__ import annotations

import json
from pathlib import Path

from polytrace_cli.ingest.runner import ingest_paths

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "verl" / "console_fixes"


def _ingest(store, path: Path):
    reports = ingest_paths(store, [path])
    assert [r.status for r in reports] == ["ingested"] * len(reports), [r.message for r in reports]
    return reports


def _meta(store) -> dict:
    return json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])


def test_a_step_printed_twice_with_other_keys_is_one_step(store):
    [report] = _ingest(store, FIXTURES / "repeated_step.log")
    assert (report.lines, report.stored, report.ignored, report.rejected) == (6, 6, 0, 0)
    rows = store.execute(
        "SELECT segment, step, gen_s, step_s, is_validation_only FROM steps ORDER BY segment, step").fetchall()
    # Step 1: validation line then training line, one step. Step 2: training then validation, one
    # step. Step 3 printed again with the same keys: a restarted job, a second segment.
    assert rows == [(0, 1, 10.0, 20.0, False), (0, 2, 11.0, 21.0, False), (0, 3, 12.0, 22.0, False),
                    (1, 3, 12.5, 22.5, False)]
    flags = store.execute("SELECT segment, step, flag, line_no FROM step_flags ORDER BY line_no").fetchall()
    assert flags == [(1, 3, "restart", 6)]
