"""TRL runs: console logs (every trap), trainer_state.json, and a TensorBoard run written at test
time by tensorboardX the way the transformers Trainer writes it (`train/` prefix); the three sources
of one fixture run give the same steps and values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "trl"
LOGGED_STEPS = (2, 4, 6, 8)
# The values of the fixture run (logging_steps=2, stopped after step 8 of 10), exactly as logged.
# Every one is a binary fraction, so TensorBoard's 32-bit floats hold it exactly too.
VALUES = {
    "loss": [0.0009765625, 0.001953125, -0.00048828125, 0.0029296875],
    "grad_norm": [0.5, 0.375, 0.625, 0.4375],
    "learning_rate": [9.5367431640625e-07] * 4,
    "num_tokens": [8192.0, 17408.0, 25600.0, 34816.0],
    "completions/mean_length": [312.5, 340.25, 298.75, 401.5],
    "completions/min_length": [12.0, 20.0, 9.0, 31.0],
    "completions/max_length": [1024.0, 1024.0, 877.0, 1024.0],
    "completions/clipped_ratio": [0.125, 0.0625, 0.0, 0.1875],
    "rewards/accuracy_reward/mean": [0.25, 0.375, 0.5, 0.4375],
    "reward": [0.25, 0.375, 0.5, 0.4375],
    "reward_std": [0.25, 0.3125, 0.28125, 0.21875],
    "frac_reward_zero_std": [0.0, 0.25, 0.125, 0.0],
    "kl": [0.0001220703125, 0.000244140625, 0.00048828125, 0.0009765625],
    "entropy": [0.75, 0.6875, 0.65625, 0.625],
    "step_time": [11.5, 12.25, 10.75, 14.0],
}
EPOCHS = [0.0625, 0.125, 0.1875, 0.25]
EVAL_AT_4 = {"eval/loss": 0.5, "eval/runtime": 1.25, "eval/samples_per_second": 12.75}
# (num_tokens(i) - num_tokens(i-1)) / 2 steps; the first: 8192 / 2 (the log starts at step 0).
TOKENS_PER_STEP = [4096.0, 4608.0, 4096.0, 4608.0]


def expected_pairs() -> dict[tuple[int, str], float]:
    pairs = {(step, key): values[i] for key, values in VALUES.items() for i, step in enumerate(LOGGED_STEPS)}
    pairs.update({(step, "num_tokens/per_step"): TOKENS_PER_STEP[i] for i, step in enumerate(LOGGED_STEPS)})
    pairs.update({(4, key): value for key, value in EVAL_AT_4.items()})
    # logging_steps=2: each logged row holds the means over 2 optimizer steps (TRL's GRPOTrainer.log
    # averages its `_metrics` lists; huggingface/trl@f2cd57710ae345ea6428ae95363267fcf38a3dc8
    # trl/trainer/grpo_trainer.py `training_step` and `log`).
    pairs.update({(step, "trl/steps_covered"): 2.0 for step in LOGGED_STEPS})
    return pairs


def stored_pairs(con, run: str, skip=("epoch", "eval/epoch")) -> dict[tuple[int, str], float]:
    rows = con.execute(
        "SELECT step, key, value FROM step_metrics JOIN runs USING (run_id) WHERE runs.name = ? AND segment = 0",
        [run]).fetchall()
    pairs = {(step, key): value for step, key, value in rows if key not in skip}
    assert len(pairs) == len([row for row in rows if row[1] not in skip]), "a (step, key) stored twice"
    return pairs


def meta(con, run: str) -> dict:
    return json.loads(con.execute("SELECT meta FROM runs WHERE name = ?", [run]).fetchall()[0][0])


def test_console_log_every_line_accounted_sft_kept_apart(store):
    [report] = ingest_paths(store, [FIXTURES / "grpo_unsloth_console.log"], run_name="console")
    assert report.format == "trl-console"
    assert (report.lines, report.stored, report.ignored, report.rejected) == (22, 5, 16, 1)
    ignored = dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall())
    assert ignored == {"SFT stage dict": 4, "end-of-training dict (run meta)": 1, "other": 6,
                       "printed dict (not a metrics dict)": 1, "tqdm": 2, "traceback": 1, "warning": 1}
    [(line_no, reason, code)] = store.execute("SELECT line_no, reason, code FROM ingest_errors").fetchall()
    assert (line_no, code) == (21, "unparsable-line") and reason.startswith("metrics dict is not a Python dict")
    assert stored_pairs(store, "console") == expected_pairs()
    # The console prints the epoch rounded to two decimals.
    epochs = dict(store.execute("SELECT step, value FROM step_metrics WHERE key = 'epoch' ORDER BY step").fetchall())
    assert epochs == {2: 0.06, 4: 0.12, 6: 0.19, 8: 0.25}
    # No SFT key reached the store, and the first logged step (2) is not taken for a resumed run.
    assert store.execute("SELECT count(*) FROM step_metrics WHERE key = 'mean_token_accuracy'").fetchall() == [(0,)]
    assert store.execute("SELECT flag FROM step_flags").fetchall() == []
    run_meta = meta(store, "console")
    assert run_meta["trl_sft_stage"] == {"dicts": 4, "last_loss": 0.5}
    assert (run_meta["trl_version"], run_meta["unsloth_version"], run_meta["transformers_version"]) == (
        "0.19.1", "2025.6.8", "4.53.0")
    assert (run_meta["trl_max_steps"], run_meta["trl_last_step"]) == (10, 8)
    assert "trl_train_summary" not in run_meta  # the end-of-training dict closed the SFT stage
    assert "log stops at step 8 of 10: no end-of-training dict" in report.notes
    framework, version = store.execute(
        "SELECT r.framework, f.format_version FROM runs r JOIN files f USING (run_id)").fetchall()[0]
    assert (framework, version) == ("trl", ">=0.15")


def test_canonical_columns_of_a_trl_run(store):
    ingest_paths(store, [FIXTURES / "grpo_unsloth_console.log"], run_name="console")
    rows = store.execute(
        "SELECT step, step_s, response_length_mean, response_length_min, response_length_max, clip_ratio,"
        " total_tokens, is_validation_only FROM steps ORDER BY step").fetchall()
    assert rows == [
        (step, VALUES["step_time"][i], VALUES["completions/mean_length"][i], VALUES["completions/min_length"][i],
         VALUES["completions/max_length"][i], VALUES["completions/clipped_ratio"][i], TOKENS_PER_STEP[i], False)
        for i, step in enumerate(LOGGED_STEPS)
    ]


def test_trl_014_strings_and_progress_bar_step_times(store):
    [report] = ingest_paths(store, [FIXTURES / "trl014_strings.log"], run_name="old")
    assert (report.lines, report.stored, report.ignored, report.rejected) == (6, 3, 3, 0)
    rows = store.execute("SELECT step, step_s, response_length_mean, flags FROM steps ORDER BY step").fetchall()
    # Bar elapsed 00:10, 00:21, 00:33 at steps 1, 2, 3, from 00:00 at 0/3.
    assert rows == [(1, 10.0, 210.5, ["tqdm_estimate"]), (2, 11.0, 230.25, ["tqdm_estimate"]),
                    (3, 12.0, 250.0, ["tqdm_estimate"])]
    values = dict(store.execute("SELECT key, value FROM step_metrics WHERE step = 2").fetchall())
    assert values["loss"] == 0.0001 and values["kl"] == 0.0025 and values["learning_rate"] == 1e-06
    assert store.execute("SELECT count(*) FROM step_metrics WHERE text_value IS NOT NULL").fetchall() == [(0,)]
    run_meta = meta(store, "old")
    assert run_meta["trl_version"] == "0.14.0"
    assert run_meta["trl_train_summary"]["train_runtime"] == 33.4
    assert store.execute("SELECT format_version FROM files").fetchall() == [("<=0.14",)]


def test_without_a_progress_bar_steps_come_from_logging_steps(store):
    [report] = ingest_paths(store, [FIXTURES / "grpo_no_bar.log"], run_name="nobar")
    assert (report.lines, report.stored, report.ignored) == (3, 2, 1)
    rows = store.execute("SELECT step, step_s, total_tokens, flags FROM steps ORDER BY step").fetchall()
    # 5000 / 5 and (11000 - 5000) / 5 tokens per step.
    # The Trainer logs when global_step % logging_steps == 0: the printed interval numbers the dicts
    # exactly, so no step is flagged as estimated.
    assert rows == [(5, 3.5, 1000.0, []), (10, 4.0, 1200.0, [])]
    assert "TRL dicts numbered k × logging_steps: logging_steps=5 as printed" in report.notes


def test_trainer_state_reads_only_the_latest_checkpoint(store):
    reports = ingest_paths(store, [FIXTURES / "grpo_out"])
    assert [(r.run, r.lines, r.stored, r.ignored) for r in reports] == [("grpo_out", 3, 0, 3), ("grpo_out", 5, 5, 0)]
    assert "superseded by checkpoint-8/trainer_state.json: its log_history holds these steps" in reports[0].notes
    assert stored_pairs(store, "grpo_out") == expected_pairs()
    epochs = dict(store.execute("SELECT step, value FROM step_metrics WHERE key = 'epoch'").fetchall())
    assert epochs == dict(zip(LOGGED_STEPS, EPOCHS))
    assert store.execute("SELECT framework FROM runs").fetchall() == [("trl",)]
    run_meta = meta(store, "grpo_out")
    assert (run_meta["logging_steps"], run_meta["max_steps"], run_meta["trl_last_step"]) == (2, 10, 8)


def write_trl_tensorboard(folder: Path) -> Path:
    """The fixture run as the Trainer's TensorBoard callback writes it: `train/<key>` per logged
    step, the evaluation dict as `eval/<key>` (its epoch as `train/epoch`)."""
    tensorboardX = pytest.importorskip("tensorboardX")
    writer = tensorboardX.SummaryWriter(logdir=str(folder))
    for i, step in enumerate(LOGGED_STEPS):
        for key, values in VALUES.items():
            writer.add_scalar(f"train/{key}", values[i], step)
        writer.add_scalar("train/epoch", EPOCHS[i], step)
        if step == 4:
            for key, value in EVAL_AT_4.items():
                writer.add_scalar(key, value, step)
    writer.close()
    [events] = folder.glob("events.out.tfevents.*")
    return events


def test_console_trainer_state_and_tensorboard_give_the_same_steps_and_values(store, tmp_path):
    events = write_trl_tensorboard(tmp_path / "tb")
    ingest_paths(store, [FIXTURES / "grpo_unsloth_console.log"], run_name="console")
    ingest_paths(store, [FIXTURES / "grpo_out" / "checkpoint-8" / "trainer_state.json"], run_name="state")
    [report] = ingest_paths(store, [events], run_name="tensorboard")
    assert report.format == "tensorboard-events" and report.rejected == 0
    expected = expected_pairs()
    assert stored_pairs(store, "console") == expected
    assert stored_pairs(store, "state") == expected
    assert stored_pairs(store, "tensorboard") == expected
    assert dict(store.execute("SELECT name, framework FROM runs").fetchall()) == {
        "console": "trl", "state": "trl", "tensorboard": "trl"}
    views = store.execute(
        "SELECT r.name, list((step, step_s, response_length_mean, clip_ratio, total_tokens) ORDER BY step)"
        " FROM steps JOIN runs r USING (run_id) GROUP BY r.name").fetchall()
    assert len({json.dumps(rows, default=str) for _, rows in views}) == 1


def test_transformers_tensorboard_folder_names_the_output_folder(store, tmp_path):
    events = write_trl_tensorboard(tmp_path / "grpo_qwen" / "runs" / "Nov26_15-55-36_node1")
    [report] = ingest_paths(store, [tmp_path / "grpo_qwen"])
    assert report.run == "grpo_qwen" and events.name in report.path


def test_tokens_per_step_by_hand():
    import polars as pl

    from polytrace_cli.ingest.formats.trl.logged import tokens_per_step

    frame = pl.DataFrame({
        "group": [0, 0, 0, 1, 1, 1],
        "step": [10, 20, 30, 60, 70, 80],
        "key": ["num_tokens"] * 6,
        # group 0 starts with training (first step = interval); group 1 is resumed at step 60,
        # and its counter restarted at 80 (no growth: no row).
        "value": [1000.0, 2500.0, 3100.0, 9000.0, 9500.0, 100.0],
        "line_no": [1, 2, 3, 4, 5, 6],
    })
    derived = tokens_per_step(frame).sort("line_no")
    assert derived.select("line_no", "value").rows() == [(1, 100.0), (2, 150.0), (3, 60.0), (5, 50.0)]
    assert set(derived["key"]) == {"num_tokens/per_step"}


def test_a_second_rl_bar_is_a_restart_and_an_overflowing_value_is_rejected(store, tmp_path):
    text = (FIXTURES / "trl014_strings.log").read_bytes()
    log = tmp_path / "restarted" / "train.log"
    log.parent.mkdir()
    log.write_bytes(text + text.replace(b"'kl': '0.005'", b"'kl': 1e400"))
    [report] = ingest_paths(store, [log])
    assert report.rejected == 1 and report.stored == 5
    [(reason, code)] = store.execute("SELECT reason, code FROM ingest_errors").fetchall()
    assert code == "out-of-range" and "1e400" in reason
    rows = store.execute("SELECT segment, step, flags FROM steps ORDER BY segment, step").fetchall()
    assert rows == [(0, 1, ["tqdm_estimate"]), (0, 2, ["tqdm_estimate"]), (0, 3, ["tqdm_estimate"]),
                    (1, 1, ["restart", "tqdm_estimate"]), (1, 2, ["tqdm_estimate"])]


def test_a_log_whose_first_dict_lies_beyond_the_sniffed_bytes(store, tmp_path):
    noise = "INFO 11-26 15:55:36 [gpu_model_runner.py:1200] Loading weights took 3.25 seconds\n" * 1000
    log = tmp_path / "late" / "train.log"
    log.parent.mkdir()
    log.write_bytes(("GRPOConfig(output_dir='out', logging_steps=2)\n" + noise).encode()
                    + (FIXTURES / "trl014_strings.log").read_bytes())
    [report] = ingest_paths(store, [log])
    assert report.format == "trl-console" and report.stored == 3 and report.ignored == 1004


def test_ppo_trainer_dicts(store, tmp_path):
    """PPOTrainer (and the older RLOOTrainer) log `objective/*`, `policy/*` and `val/*` keys, and no
    step time: the bar gives it."""
    dicts = [{"eps": 4, "objective/kl": 0.25, "objective/entropy": 40.5, "objective/rlhf_reward": -1.5,
              "policy/clipfrac_avg": 0.0625, "val/ratio": 1.0, "lr": 3e-06, "episode": 64 * step, "epoch": 0.01 * step}
             for step in (1, 2)]
    lines = ["\r  0%|          | 0/2 [00:00<?, ?it/s]\r 50%|█████     | 1/2 [00:07<00:07, 7.00s/it]\r" + repr(dicts[0]),
             "\r 50%|█████     | 1/2 [00:07<00:07, 7.00s/it]\r100%|██████████| 2/2 [00:15<00:00, 7.50s/it]\r" + repr(dicts[1])]
    log = tmp_path / "ppo" / "train.log"
    log.parent.mkdir()
    log.write_bytes(("\n".join(lines) + "\n").encode())
    [report] = ingest_paths(store, [log])
    assert report.format == "trl-console" and (report.lines, report.stored) == (2, 2)
    assert store.execute("SELECT step, step_s, is_validation_only FROM steps ORDER BY step").fetchall() == [
        (1, 7.0, False), (2, 8.0, False)]
    assert store.execute("SELECT framework FROM runs").fetchall() == [("trl",)]
    aliases = dict(store.execute(
        "SELECT key, canonical FROM metric_aliases WHERE format = 'trl-console' AND key LIKE 'objective/%'"
        " ORDER BY key").fetchall())
    assert aliases == {"objective/entropy": "entropy_mean", "objective/kl": "kl_mean",
                       "objective/rlhf_reward": "reward_mean"}
