"""The consistency findings `explain` and the report show (`diagnose.telemetry.consistency_findings`),
on a verl console log written with known contradictions; every number and sentence below by hand."""

from __future__ import annotations

from datetime import datetime, timezone

from polytrace_cli.analyze.common import ALL_STEPS
from polytrace_cli.diagnose.telemetry import consistency_findings, telemetry_findings
from polytrace_cli.ingest.driver import ingest_paths

START = 1_700_000_000.0


def kubectl_stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def test_the_four_consistency_findings_read_as_written(store, tmp_path):
    """8 GPUs configured. Printed at 15 s, 30 s and 56 s (the console clock), each step's gen 10 s and
    update_actor 5 s:
    step 1: total 15 s, MFU 0.41, 100,000 tokens / (833.33 × 15 s) = 8 GPUs;
    step 2: total 12 s (stages 15 s: 3 s beyond it), MFU 1.37, 100,000 / (2,083.33 × 12) = 4 GPUs,
            gap 15 s − 12 s = 3 s untimed;
    step 3: total 20 s, MFU 1.2, 100,000 / (1,250 × 20) = 4 GPUs, gap 26 s − 20 s = 6 s untimed.
    So: untimed 3 + 6 = 9 s over 2 of 2 gaps; stage excess 3 s in 1 step; MFU above 1 in 2 steps (at most
    1.37); the throughput implies 4 GPUs (median) in 2 steps."""
    rows = [(15.0, 1, 15.0, 0.41, 833.33, 15.0), (30.0, 2, 12.0, 1.37, 2083.33, 12.0),
            (56.0, 3, 20.0, 1.2, 1250.0, 20.0)]
    lines = ["{'trainer': {'nnodes': 1, 'n_gpus_per_node': 8}}"]
    lines += [f"{kubectl_stamp(START + at)} step:{step} - timing_s/gen:10.0 - timing_s/update_actor:5.0"
              f" - timing_s/step:{total} - perf/mfu/actor:{mfu} - perf/total_num_tokens:100000"
              f" - perf/throughput:{throughput} - perf/time_per_step:{seconds}"
              for at, step, total, mfu, throughput, seconds in rows]
    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text("\n".join(lines) + "\n")
    ingest_paths(store, [log])
    [(run_id,)] = store.execute("SELECT run_id FROM runs").fetchall()
    found = consistency_findings(store, run_id, 90.0, ALL_STEPS)
    assert [{key: value for key, value in f.items() if key != "seconds"} for f in found] == [
        {"cause": "untimed", "share": 0.1, "steps": [2, 3],
         "text": "9.0 s between steps that no timer counts, in 2 of 2 steps (gap between two steps' records − step"
                 " time, over max(1 s, 5% of the step)): logging, data loading or work outside the step timer"},
        {"cause": "stage_excess", "share": 3.0 / 90.0, "steps": [2],
         "text": "in 1 step the stage timers add up to more than the logged step total (by up to 3.0 s): timers that"
                 " overlap, or a step total that leaves work out; shares of the step computed from them do not add up"},
        {"cause": "mfu_impossible", "share": None, "steps": [2, 3],
         "text": "MFU logged above 1 (up to 1.37) in 2 steps: no device exceeds its peak, so the FLOPs counted or the"
                 " peak assumed is wrong, and throughput read from it is too"},
        {"cause": "throughput_mismatch", "share": None, "steps": [2, 3],
         "text": "the logged throughput contradicts tokens ÷ time in 2 steps: total_tokens / (throughput ×"
                 " time_per_step) implies 4.0 GPUs (median), not the config's; per-GPU throughput read from this log"
                 " is off by as much"},
    ]
    assert [f["seconds"] for f in found] == [9.0, 3.0, None, None]
    # No engine samples: the telemetry findings are these four alone.
    assert telemetry_findings(store, run_id, 90.0, ALL_STEPS) == found
