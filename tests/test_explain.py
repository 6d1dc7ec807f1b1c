"""`explain`: causes of slow steps on logs written from a known model, hand-computed decompositions,
per-sample drill-down, lengths-only runs and the command line."""

from __future__ import annotations

import csv
import io
import json
import math
import re

import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.diagnose import CAUSES, explain_run
from polytrace_cli.diagnose.findings import cadence
from polytrace_cli.ingest.driver import ingest_paths
from test_model import ingest_known, write_known_log
from conftest import need_real_data

INJECTED = {17: "long_tail", 33: "token_volume", 46: "dp_imbalance", 58: "unexplained", 77: "weight_sync",
            94: "long_tail"}


def _explained(store, tmp_path, seed: int, **options):
    log = write_known_log(tmp_path / f"train_{seed}.log", steps=120, seed=seed, inject=INJECTED, spread=0.2,
                          validation_every=10, checkpoint_every=25, **options)
    run = ingest_known(store, log, run=f"known{seed}")
    return log, explain_run(store, run).to_dict()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_injected_cause_is_named_first_and_nothing_else_is_slow(store, tmp_path, seed):
    log, doc = _explained(store, tmp_path, seed)
    first = {row["step"]: row["causes"][0]["cause"] for row in doc["steps"]}
    for step, cause in log.injected.items():
        assert first.get(step) == cause, (step, cause, [r for r in doc["steps"] if r["step"] == step])
    assert set(first) == set(log.injected)
    assert doc["basis"] == "seconds" and doc["slow_steps"] == len(log.injected)
    # every cause word is one of the vocabulary
    assert {c["cause"] for row in doc["steps"] for c in row["causes"]} <= set(CAUSES)


def test_causes_add_up_to_the_excess_on_every_step(store, tmp_path):
    log, doc = _explained(store, tmp_path, seed=4)
    for row in doc["steps"]:
        assert sum(c["seconds"] for c in row["causes"]) == pytest.approx(row["excess_s"], abs=1e-6)
        assert row["excess_s"] == pytest.approx(row["seconds"] - row["expected_s"], abs=1e-9)
        assert row["seconds"] == pytest.approx(log.seconds[row["step"]]["step"], abs=1e-5)
    for step in (5, 61, 119):  # ordinary steps, asked for one by one
        row = explain_run(store, "known4", step=step).to_dict()["steps"][0]
        assert row["step"] == step and row["slow"] is False
        assert sum(c["seconds"] for c in row["causes"]) == pytest.approx(row["excess_s"], abs=1e-6)


def test_injected_seconds_are_recovered(store, tmp_path):
    log, doc = _explained(store, tmp_path, seed=5)
    rows = {row["step"]: {c["cause"]: c for c in row["causes"]} for row in doc["steps"]}
    # validation and checkpoint are the logged seconds
    assert rows[30]["validation"]["seconds"] == pytest.approx(log.seconds[30]["testing"], abs=1e-5)
    assert rows[75]["checkpoint"]["seconds"] == pytest.approx(log.seconds[75]["save_checkpoint"], abs=1e-5)
    # gen doubled: the extra gen seconds land in unexplained, in stage gen
    gen = log.seconds[58]["gen"]
    assert rows[58]["unexplained"]["stage"] == "gen"
    assert rows[58]["unexplained"]["seconds"] == pytest.approx(gen / 2, rel=0.1)
    # weight sync × 8: seven typical syncs more
    assert rows[77]["weight_sync"]["seconds"] == pytest.approx(7 * 1.5, rel=0.1)
    # the tail at the cap: b_tail · (cap − typical r_max), in gen
    tail = rows[17]["long_tail"]
    assert tail["stage"] == "gen" and tail["seconds"] == pytest.approx(0.004 * (16384 - 6000), rel=0.08)
    assert rows[46]["dp_imbalance"]["stage"] == "update_actor"


def test_findings_name_periodic_overheads_with_their_share(store, tmp_path):
    log, doc = _explained(store, tmp_path, seed=6)
    findings = {f["cause"]: f for f in doc["findings"]}
    seconds = [f["seconds"] for f in doc["findings"]]
    assert seconds == sorted(seconds, reverse=True)
    run_seconds = sum(s["step"] for s in log.seconds.values())
    testing = sum(s.get("testing", 0) for s in log.seconds.values())
    validation = findings["validation"]
    assert validation["steps"] == list(range(10, 121, 10))
    assert validation["seconds"] == pytest.approx(testing, abs=1e-4)
    assert validation["share"] == pytest.approx(testing / run_seconds, rel=1e-6)
    assert validation["text"].startswith("validation every 10 steps took")
    assert f"{testing / run_seconds:.1%} of the run" in validation["text"]
    assert findings["checkpoint"]["text"].startswith("checkpoints every 25 steps took")
    assert findings["warmup"]["steps"] == [1]
    assert findings["long_tail"]["steps"] == [17, 94]
    assert {"token_volume", "dp_imbalance", "unexplained", "weight_sync"} <= set(findings)


def _console_line(number: int, **timers: float) -> str:
    pairs = [f"timing_s/{k}:{v}" for k, v in timers.items() if not k.startswith("len_")]
    pairs += [f"response_length/max:{v}" for k, v in timers.items() if k == "len_max"]
    return f"step:{number} - " + " - ".join(pairs)


def test_hand_computed_long_tail(store, tmp_path):
    # gen = 2 + 0.01 · r_max exactly, 1 s of rest. Training steps 2–10 have median r_max 140, so
    # expected = 2 + 1.4 + 1 = 4.4 s; step 10 (r_max 1000) takes 13 s: excess 8.6 = 0.01 · (1000 − 140).
    lengths = [200, 100, 120, 140, 160, 180, 100, 120, 140, 1000]
    lines = [_console_line(i, gen=2 + 0.01 * r, step=3 + 0.01 * r, len_max=r) for i, r in enumerate(lengths, 1)]
    path = tmp_path / "hand.log"
    path.write_text("\n".join(lines) + "\n")
    ingest_paths(store, [path], run_name="hand")
    doc = explain_run(store, "hand").to_dict()
    assert doc["expected_s"] == pytest.approx(4.4, abs=1e-6)
    assert [row["step"] for row in doc["steps"]] == [10]
    step10 = doc["steps"][0]
    assert step10["excess_s"] == pytest.approx(8.6, abs=1e-9)
    tail = step10["causes"][0]
    assert (tail["cause"], tail["stage"]) == ("long_tail", "gen")
    assert tail["seconds"] == pytest.approx(8.6, abs=1e-5)
    assert doc["model"]["gen"]["r_max"] == pytest.approx(0.01, rel=1e-6)
    assert doc["model"]["other"]["intercept"] == pytest.approx(1.0, abs=1e-9)


def test_hand_computed_long_tail_against_the_steps_around_it(store, tmp_path):
    # gen = 2 + 0.01 · r_max exactly, 1 s of rest; r_max drifts 10 tokens a step (100 + 10 · i) and
    # step 30 has 500 more (900). Training steps are 2–40, so the 21 around step 30 are steps 20–40,
    # whose median r_max is step 31's, 410: expected = 2 + 4.1 + 1 = 7.1 s, step 30 takes
    # 3 + 9 = 12 s, excess 4.9 = long_tail 0.01 · (900 − 410): the 500 tokens it had more, less one
    # step of drift the median cannot tell from it. The run's median r_max (310, step 21) would
    # blame 6 s on the tail, one second of which is the drift.
    lengths = [100 + 10 * i + (500 if i == 30 else 0) for i in range(1, 41)]
    lines = [_console_line(i, gen=2 + 0.01 * r, step=3 + 0.01 * r, len_max=r) for i, r in enumerate(lengths, 1)]
    path = tmp_path / "drift.log"
    path.write_text("\n".join(lines) + "\n")
    ingest_paths(store, [path], run_name="drift")
    doc = explain_run(store, "drift", step=30).to_dict()
    assert doc["expected_s"] == pytest.approx(2 + 3.1 + 1, abs=1e-5)
    step30 = doc["steps"][0]
    assert step30["seconds"] == pytest.approx(12.0, abs=1e-9)
    assert step30["expected_s"] == pytest.approx(7.1, abs=1e-5)
    assert step30["excess_s"] == pytest.approx(4.9, abs=1e-5)
    tail = step30["causes"][0]
    assert (tail["cause"], tail["stage"]) == ("long_tail", "gen")
    assert tail["seconds"] == pytest.approx(4.9, abs=1e-5)
    steady = explain_run(store, "drift", step=15).to_dict()["steps"][0]
    assert steady["excess_s"] == pytest.approx(0.0, abs=1e-5)
    assert steady["expected_s"] == pytest.approx(3 + 0.01 * 250, abs=1e-5)


def test_testing_outside_the_step_time_still_counts(store, tmp_path):
    # A log whose step time leaves testing out: the wall time adds it back.
    lines = [_console_line(i, gen=5.0, step=6.0) for i in range(1, 12)]
    lines.append(_console_line(12, gen=5.0, step=6.0, testing=30.0))
    path = tmp_path / "outside.log"
    path.write_text("\n".join(lines) + "\n")
    ingest_paths(store, [path], run_name="outside")
    doc = explain_run(store, "outside").to_dict()
    (row,) = doc["steps"]
    assert row["step"] == 12 and row["seconds"] == pytest.approx(36.0)
    assert row["causes"][0] == {"cause": "validation", "seconds": 30.0, "stage": "testing", "stands_out": True}
    assert doc["notes"][-1].startswith("the log has no response lengths")


def _insert_samples(store, run_id: int, step: int, rows: list[tuple[int, int, int, int]]) -> None:
    store.executemany(
        "INSERT INTO sample_rows (run_id, file_id, step, dp_rank, prompt_idx, sample_idx, prompt_len, response_len)"
        " VALUES (?, 1, ?, ?, ?, ?, 100, ?)", [(run_id, step, *row) for row in rows])


def test_per_sample_runs_name_the_rank_and_samples_of_the_tail(store, tmp_path):
    log = write_known_log(tmp_path / "train.log", steps=40, seed=8, inject={17: "long_tail"}, spread=0.2)
    ingest_known(store, log)
    run_id = store.execute("SELECT run_id FROM runs WHERE name = 'known'").fetchall()[0][0]
    for step in (16, 17):
        longest = 16384 if step == 17 else 6000
        _insert_samples(store, run_id, step, [(0, 0, 0, 900), (0, 0, 1, 1200), (1, 0, 0, longest),
                                              (1, 1, 0, 2000), (1, 1, 1, 700)])
    doc = explain_run(store, "known", step=17).to_dict()
    tail = next(c for c in doc["steps"][0]["causes"] if c["cause"] == "long_tail")
    assert tail["samples"][0] == {"rank": 1, "prompt_idx": 0, "sample_idx": 0, "length": 16384}
    assert [s["length"] for s in tail["samples"]] == [16384, 2000, 1200]


def test_lengths_only_run_gets_tokens_and_a_note(store, tmp_path):
    store.execute("INSERT INTO runs (run_id, name) VALUES (7, 'trace')")
    for step in range(10):
        longest = 5000 if step == 6 else 400 + 10 * step
        rank1 = [(1, 0, 0, 300), (1, 0, 1, 350)] if step != 3 else [(1, p, 0, 900) for p in range(8)]
        _insert_samples(store, 7, step, [(0, 0, 0, longest), (0, 0, 1, 200), *rank1])
    doc = explain_run(store, "trace").to_dict()
    assert doc["basis"] == "tokens" and doc["notes"][0].startswith("seconds need step timings")
    rows = {row["step"]: row for row in doc["steps"]}
    assert set(rows) == {3, 6}
    tail = rows[6]["causes"][0]
    assert tail["cause"] == "long_tail" and tail["r_max"] == 5000 and tail["samples"][0]["length"] == 5000
    imbalance = rows[3]["causes"][0]
    assert imbalance["cause"] == "dp_imbalance" and imbalance["rank"]["rank"] == 1
    assert rows[6]["seconds"] is None
    assert [f["cause"] for f in doc["findings"]] == ["long_tail", "dp_imbalance"]


@pytest.mark.realdata
def test_real_traces_explain_in_tokens(store):
    ingest_paths(store, [need_real_data("polytrace", "verl")], run_name="verl")
    doc = explain_run(store, "verl").to_dict()
    assert doc["basis"] == "tokens" and doc["notes"][0].startswith("seconds need step timings")
    lengths = store.execute("SELECT max(response_len) FROM samples").fetchall()[0][0]
    for row in doc["steps"]:
        assert row["causes"] and all(c["cause"] in CAUSES for c in row["causes"])
    if doc["findings"] and doc["findings"][0]["cause"] == "long_tail":
        assert f"{lengths:,}" in doc["findings"][0]["text"]


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_cli_explain_json_table_and_errors(tmp_path):
    log = write_known_log(tmp_path / "train.log", steps=60, seed=9, inject={17: "long_tail", 33: "unexplained"},
                          spread=0.2, validation_every=10)
    db = str(tmp_path / "cli.duckdb")
    assert _cli("ingest", str(log.path), "--run", "known", "--db", db).exit_code == 0
    result = _cli("explain", "known", "--json", "--db", db)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert set(doc) >= {"run", "steps", "findings"} and doc["run"] == "known"
    for row in doc["steps"]:
        assert set(row) >= {"step", "seconds", "expected_s", "excess_s", "causes"}
        assert all(set(c) >= {"cause", "seconds", "stage"} for c in row["causes"])
    for finding in doc["findings"]:
        assert set(finding) >= {"cause", "seconds", "share", "steps", "text"}
    one = json.loads(_cli("explain", "known", "--step", "5", "--json", "--db", db).stdout)
    assert [row["step"] for row in one["steps"]] == [5]
    top = json.loads(_cli("explain", "known", "--top", "2", "--json", "--db", db).stdout)
    assert len(top["steps"]) == 2 and len(top["findings"]) <= 2
    as_csv = _cli("explain", "known", "--csv", "--db", db)
    assert as_csv.exit_code == 0, as_csv.output
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    # One row per step and cause, the same numbers as the JSON.
    assert len(rows) == sum(max(1, len(step["causes"])) for step in doc["steps"])
    first = doc["steps"][0]
    assert [(int(r["step"]), r["cause"]) for r in rows[:len(first["causes"])]] == \
        [(first["step"], c["cause"]) for c in first["causes"]]
    assert float(rows[0]["cause_seconds"]) == pytest.approx(first["causes"][0]["seconds"])
    table = _cli("explain", "known", "--db", db)
    assert table.exit_code == 0
    assert "validation every 10 steps took" in table.stdout
    # It opens with where the typical step goes, then the top levers with their what-if savings, then the
    # time lost ranked and the slow steps.
    lines = table.stdout.splitlines()
    assert lines[1].strip() == doc["typical_step"]["text"][:len(lines[1].strip())]
    assert lines[1].strip().startswith("Typical step ")
    order = [next(i for i, line in enumerate(lines) if line.startswith(head))
             for head in ("Top levers", "Where the time went", "Slow steps")]
    assert order == sorted(order)
    levers = [line for line in lines[order[0] + 1:order[1]] if line.startswith("  - ")]
    assert 1 <= len(levers) <= 3
    shares = [float(re.search(r", ([0-9.]+)% of the run", line).group(1)) for line in levers]
    assert shares == sorted(shares, reverse=True) and shares[-1] > 0
    assert max(len(line) for line in table.stdout.splitlines()) <= 100
    for args, message in ((("explain", "nope"), "no run named nope"),
                          (("explain", "known", "--step", "999"), "has no step 999"),
                          (("explain", "known", "--top", "0"), "--top takes a positive number")):
        bad = _cli(*args, "--db", db)
        assert bad.exit_code == 2 and message in bad.stderr and "Traceback" not in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    assert not math.isnan(doc["expected_s"])


def test_cadence_words():
    assert cadence([10, 20, 30, 40]) == "every 10 steps"
    assert cadence([*range(20, 201, 20), 130]) == "mostly every 20 steps (11 steps)"
    assert cadence([3, 9]) == "at 2 steps" and cadence([7]) == "at 1 step"


def test_warmup_after_a_restart_and_steady_drift(store, tmp_path):
    # 60 steps, then the job restarts from step 41: the first step after the restart is slow again.
    # Response lengths grow 40% over each part; nothing else is injected.
    first = write_known_log(tmp_path / "a.log", steps=60, seed=11, spread=0.2, drift=0.4)
    second = write_known_log(tmp_path / "b.log", steps=50, seed=12, spread=0.2, drift=0.4, first_step=41,
                             inject={70: "dp_imbalance"})
    path = tmp_path / "train.log"
    path.write_text(first.path.read_text() + second.path.read_text())
    ingest_paths(store, [path], run_name="restarted")
    doc = explain_run(store, "restarted").to_dict()
    slow = {(row["segment"], row["step"]): row["causes"][0]["cause"] for row in doc["steps"]}
    assert slow == {(0, 1): "warmup", (1, 41): "warmup", (1, 70): "dp_imbalance"}
    warmup = next(f for f in doc["findings"] if f["cause"] == "warmup")
    assert warmup["steps"] == [1, 41] and "and after restarts" in warmup["text"]


def test_unlogged_training_stages_sit_in_the_rest(store, tmp_path):
    # Only gen and weight sync are timed: the token-bound training stages are in the rest, which
    # then follows the busiest rank's tokens with Σ_k b_k = 2e-5 + 1.5e-5 + 8e-5.
    log = write_known_log(tmp_path / "train.log", steps=100, seed=13, inject={40: "dp_imbalance"},
                          log_stages=("gen", "update_weights"))
    run = ingest_known(store, log)
    doc = explain_run(store, run).to_dict()
    assert doc["model"]["other"]["busiest_rank_tokens"] == pytest.approx(1.15e-4, rel=0.05)
    step40 = next(row for row in doc["steps"] if row["step"] == 40)
    assert step40["causes"][0]["cause"] == "dp_imbalance" and step40["causes"][0]["stage"] == "other"


def test_imbalance_before_verl_balancing_is_not_blamed(store, tmp_path):
    # Stages follow the balanced busiest rank: a step whose unbalanced max is 3x the mean is not
    # slow, and no usual-level imbalance cost is claimed beyond the balanced one.
    log = write_known_log(tmp_path / "train.log", steps=80, seed=22, spread=0.3, balanced=True,
                          inject={30: "dp_imbalance"})
    doc = explain_run(store, ingest_known(store, log)).to_dict()
    assert 30 not in {row["step"] for row in doc["steps"]}
    assert any("global_seqlen/balanced_max" in note for note in doc["notes"])
    usual = [f for f in doc["findings"] if f.get("typical")]
    assert all("after balancing" in f["text"] and f["share"] < 0.01 for f in usual)


def test_progress_bar_step_times_get_one_whole_step_line(store, tmp_path):
    # No metric lines: 20 step times from the tqdm bar, 60–63 s, step 12 takes 40 s more.
    lines = ["(TaskRunner pid=5) Using dataset class: RLHFDataset",
             "Training Progress:   0%|          | 0/40 [00:00<?, ?it/s]"]
    elapsed = 0
    for step in range(1, 21):
        seconds = 60 + step % 4 + (40 if step == 12 else 0)
        elapsed += seconds
        lines.append(f"Training Progress:   {step * 2}%|          | {step}/40 "
                     f"[{elapsed // 60:02d}:{elapsed % 60:02d}<10:00, {seconds}.00s/it]")
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    ingest_paths(store, [path], run_name="bar")
    doc = explain_run(store, "bar").to_dict()
    assert [row["step"] for row in doc["steps"]] == [12]
    cause = doc["steps"][0]["causes"][0]
    assert (cause["cause"], cause["stage"]) == ("unexplained", "whole_step")
    # the constant is the median of steps 2–20 (four 60s, four 61s, five 62s, five 63s and 100): 62 s
    assert doc["expected_s"] == pytest.approx(62.0, abs=0.01)
    assert cause["seconds"] == pytest.approx(38.0, abs=0.01)
    assert any("progress bar" in note for note in doc["notes"])


def test_a_finding_too_small_for_a_tenth_of_a_percent_says_so():
    from polytrace_cli.diagnose.findings import _finding

    assert _finding("weight_sync", 25.0, 150_000.0, [3], "weight sync ran slower")["text"] == (
        "weight sync ran slower, under 0.1% of the run")
    assert _finding("validation", 750.0, 150_000.0, [50], "validation took")["text"] == (
        "validation took, 0.5% of the run")
