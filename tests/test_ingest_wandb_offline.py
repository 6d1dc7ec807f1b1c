"""wandb offline runs written at test time by the real wandb package (WANDB_MODE=offline, no network),
read back from the `.wandb` record log: every history value exactly, config and summary as run meta."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polytrace_cli.ingest.formats.wandb.offline import BLOCK_BYTES, read_records
from polytrace_cli.ingest.driver import ingest_paths

PROJECT_ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("wandb")

# verl-style keys over five steps; step 3's reward is NaN, step 4 logs a string and a nested dict.
HISTORY = {
    step: {"timing_s/step": 10.0 + step / 3, "timing_s/gen": 6.1 * step, "response_length/mean": 300.1 + step,
           "response_length/clip_ratio": 0.1 * step, "critic/rewards/mean": float("nan") if step == 3 else 0.07 * step}
    for step in range(1, 6)
}
CONFIG = {"actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-7B"}, "rollout": {"n": 8}},
          "data": {"max_response_length": 4096}, "trainer": {"nnodes": 2, "n_gpus_per_node": 8},
          "algorithm": {"adv_estimator": "grpo"}}
LONG_STEPS = 300
WRITER = """
import json, sys, wandb
LONG_STEPS = int(sys.argv[7])
history, config, steps = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
run = wandb.init(project="polytrace-test", config=config, settings=wandb.Settings(x_disable_stats=True))
for step in range(1, steps + 1):
    row = {key: float(value) for key, value in history[str(step)].items()}
    if step == 4:
        row.update({"note": "lr warmup done", "nested": {"depth": 2.5}})
    run.log(row, step=step)
run.summary["best_reward"] = 0.35
run.finish()
# A TRL run as the Trainer's wandb callback logs it: `train/` keys, `train/global_step` beside `_step`.
trl = wandb.init(project="polytrace-test", dir=sys.argv[4], settings=wandb.Settings(x_disable_stats=True))
for step, (mean_length, tokens, reward) in json.loads(sys.argv[5]).items():
    trl.log({"train/completions/mean_length": mean_length, "train/num_tokens": tokens, "train/reward": reward,
             "train/global_step": int(step)}, step=int(step))
trl.finish()
# A long run: its record log spans several 32 KiB blocks (padding, records split across blocks).
long = wandb.init(project="polytrace-test", dir=sys.argv[6], settings=wandb.Settings(x_disable_stats=True))
for step in range(1, LONG_STEPS + 1):
    long.log({"timing_s/step": step / 8, "timing_s/gen": step / 16, "response_length/mean": 100.0 + step}, step=step)
long.finish()
"""


TRL_ROWS = {2: (312.5, 8192.0, 0.25), 4: (340.1, 17408.0, 0.375), 6: (298.7, 25600.0, 0.5)}


def write_offline_run(tmp_path: Path, steps: int = 5) -> Path:
    """Offline run folders written by wandb itself: a verl-style run in tmp_path/wandb (its .wandb
    file is returned), a TRL run in tmp_path/trl/wandb and a long run in tmp_path/long/wandb."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
           "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_API_KEY": "", "HOME": str(tmp_path)}
    history = {str(step): {key: (value if not math.isnan(value) else "NaN") for key, value in row.items()}
               for step, row in HISTORY.items()}
    (tmp_path / "trl").mkdir()
    (tmp_path / "long").mkdir()
    subprocess.run([sys.executable, "-c", WRITER, json.dumps(history), json.dumps(CONFIG), str(steps),
                    str(tmp_path / "trl"), json.dumps(TRL_ROWS), str(tmp_path / "long"),
                    str(LONG_STEPS)],
                   env=env, check=True, timeout=120, capture_output=True)
    [log] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    return log


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory) -> Path:
    return write_offline_run(tmp_path_factory.mktemp("wandb"))


def test_history_config_and_summary_read_back_exactly(store, offline_run):
    [report] = ingest_paths(store, [offline_run], run_name="offline")
    assert report.format == "wandb-offline" and report.rejected == 0
    assert report.lines == report.stored + report.ignored
    stored = {(step, key): (value, text) for step, key, value, text in store.execute(
        "SELECT step, key, value, text_value FROM step_metrics").fetchall()}
    for step, row in HISTORY.items():
        for key, value in row.items():
            got = stored.pop((step, key))[0]
            assert (math.isnan(got) and math.isnan(value)) or got == value, (step, key)
    assert stored == {(4, "note"): (None, "lr warmup done"), (4, "nested.depth"): (2.5, None)}
    assert store.execute("SELECT DISTINCT segment FROM step_metrics").fetchall() == [(0,)]
    framework, meta = store.execute("SELECT framework, meta FROM runs").fetchall()[0]
    meta = json.loads(meta)
    assert framework == "verl"
    assert (meta["model"], meta["n_sampling"], meta["max_response_len"], meta["n_gpus"], meta["algorithm"]) == (
        "Qwen/Qwen2.5-7B", 8, 4096, 16, "grpo")
    assert meta["wandb_summary"]["best_reward"] == 0.35 and meta["wandb_summary"]["timing_s/step"] == 10.0 + 5 / 3
    assert meta["wandb_last_step"] == 5 and meta["wandb_project"] == "polytrace-test"
    ignored = dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall())
    assert all(rule.endswith(" record") for rule in ignored)


def test_a_trl_run_loses_its_train_prefix_and_gets_tokens_per_step(store, offline_run):
    [log] = (offline_run.parents[2] / "trl" / "wandb").glob("offline-run-*/run-*.wandb")
    [report] = ingest_paths(store, [log], run_name="trl")
    assert report.rejected == 0
    assert store.execute("SELECT framework FROM runs").fetchall() == [("trl",)]
    rows = store.execute("SELECT step, response_length_mean, total_tokens FROM steps ORDER BY step").fetchall()
    # Tokens per step: 8192 / 2 (first step = the interval), then the growth over 2 steps.
    assert rows == [(2, 312.5, 4096.0), (4, 340.1, 4608.0), (6, 298.7, 4096.0)]
    keys = {key for (key,) in store.execute("SELECT DISTINCT key FROM step_metrics").fetchall()}
    assert keys == {"completions/mean_length", "num_tokens", "reward", "global_step", "num_tokens/per_step"}


def test_steps_view_of_an_offline_run(store, offline_run):
    ingest_paths(store, [offline_run])
    rows = store.execute("SELECT step, step_s, gen_s, response_length_mean FROM steps ORDER BY step").fetchall()
    assert rows == [(s, HISTORY[s]["timing_s/step"], HISTORY[s]["timing_s/gen"], HISTORY[s]["response_length/mean"])
                    for s in range(1, 6)]


def test_a_cut_record_log_keeps_the_records_before_the_damage(store, offline_run, tmp_path):
    data = offline_run.read_bytes()
    records, damaged = read_records(data)
    assert damaged is None and len(data) < BLOCK_BYTES * 4
    broken = tmp_path / "wandb" / offline_run.parent.name / offline_run.name
    broken.parent.mkdir(parents=True)
    cut = len(data) * 2 // 3
    while cut < len(data) and read_records(data[:cut])[1] is None:  # a cut between two records damages nothing
        cut += 1
    broken.write_bytes(data[:cut])
    kept, damaged = read_records(broken.read_bytes())
    assert 0 < len(kept) < len(records) and kept == records[: len(kept)] and damaged is not None
    [report] = ingest_paths(store, [broken])
    assert report.rejected == 1 and report.lines == len(kept) + 1
    [(reason, code)] = store.execute("SELECT reason, code FROM ingest_errors").fetchall()
    assert code == "corrupt-file" and reason.startswith(f"record log damaged after {len(kept)} readable records")


def test_a_flipped_byte_fails_the_checksum(offline_run):
    data = bytearray(offline_run.read_bytes())
    records, _ = read_records(bytes(data))
    data[len(data) // 2] ^= 0xFF
    kept, damaged = read_records(bytes(data))
    assert len(kept) < len(records) and damaged is not None and damaged <= len(data) // 2


def test_without_wandb_the_file_is_rejected_naming_the_extra(offline_run, tmp_path):
    script = ("import sys; sys.modules['wandb'] = None; from polytrace_cli.cli import app; "
              "sys.argv = ['polytrace'] + sys.argv[1:]; app()")
    result = subprocess.run(
        [sys.executable, "-c", script, "ingest", str(offline_run), "--db", str(tmp_path / "s.duckdb"), "--json"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    [report] = json.loads(result.stdout)
    assert report["status"] == "rejected"
    assert report["message"] == "reading wandb offline runs needs the wandb package: pip install 'polytrace[wandb]'"


def test_a_record_log_of_many_blocks_reads_every_record_across_the_block_edges(store, offline_run):
    """The long run's log, as wandb wrote it: it spans several blocks and holds records split into
    pieces across them; every step of it is read back exactly."""
    from hostile_inputs import FIRST, LAST, WANDB_BLOCK, record_pieces

    [log] = (offline_run.parents[2] / "long" / "wandb").glob("offline-run-*/run-*.wandb")
    data = log.read_bytes()
    kinds = {kind for _, kind, _ in record_pieces(data)}
    assert len(data) > 3 * WANDB_BLOCK and {FIRST, LAST} <= kinds, (len(data), kinds)
    [report] = ingest_paths(store, [log], run_name="long")
    assert report.rejected == 0 and report.lines == report.stored + report.ignored
    rows = store.execute("SELECT step, step_s, gen_s, response_length_mean FROM steps ORDER BY step").fetchall()
    assert rows == [(step, step / 8, step / 16, 100.0 + step) for step in range(1, LONG_STEPS + 1)]


@pytest.mark.parametrize("room", [7, 3], ids=["empty-first-piece", "padding"])
def test_the_block_end_is_read_as_the_writer_frames_it(store, tmp_path, room):
    """A record ending with `room` bytes left in its block: with exactly a header's room (7) the writer
    puts an empty first piece of the next record there; with less (3) zero padding, and the next
    record starts the next block. A third record spans three blocks."""
    from hostile_inputs import FIRST, FULL, WANDB_BLOCK, record_pieces, wandb_history, wandb_record_log

    def history(step: int, note: int) -> bytes:
        return wandb_history(step, {"timing_s/step": f"{step}.5", "note": json.dumps("n" * note)})

    first = history(1, 0)
    # The note length that makes record 2 end with `room` bytes left in the first block (7-byte file header).
    target = WANDB_BLOCK - 7 - (7 + len(first)) - 7 - room
    note = next(n for n in range(target - 100, target) if len(history(2, n)) == target)
    bodies = [first, history(2, note), history(3, 70_000), history(4, 10)]
    data = wandb_record_log(bodies)
    pieces = list(record_pieces(data))
    if room == 7:
        assert (WANDB_BLOCK - 7, FIRST, 0) in pieces
    else:
        assert data[WANDB_BLOCK - 3:WANDB_BLOCK] == bytes(3) and pieces[2][:2] == (WANDB_BLOCK, FIRST)
    assert [kind for _, kind, _ in pieces].count(FULL) == 3
    path = tmp_path / "wandb" / "offline-run-20250101_000000-abc" / "run-abc.wandb"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    [report] = ingest_paths(store, [path])
    assert (report.lines, report.stored, report.rejected) == (4, 4, 0)
    assert store.execute("SELECT step, value FROM step_metrics WHERE key = 'timing_s/step' ORDER BY step").fetchall() \
        == [(1, 1.5), (2, 2.5), (3, 3.5), (4, 4.5)]
