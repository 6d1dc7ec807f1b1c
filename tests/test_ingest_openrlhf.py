"""OpenRLHF console logs: Global step dicts, evaluation lines, tqdm fallback, every line accounted."""

from __future__ import annotations

import json
import math
from pathlib import Path

from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "openrlhf"


def _metrics(con, step: int, segment: int = 0) -> dict:
    rows = con.execute(
        "SELECT key, value, text_value FROM step_metrics WHERE step = ? AND segment = ?", [step, segment]
    ).fetchall()
    return {key: (value if text is None else text) for key, value, text in rows}


def test_global_step_lines_evaluation_and_accounting(store):
    path = FIXTURES / "train_global_step.log"
    [report] = ingest_paths(store, [path])
    assert report.format == "openrlhf-console"
    assert (report.lines, report.stored, report.ignored, report.rejected) == (12, 4, 7, 1)
    assert report.rows == 14 + 6 + 3 + 3 + 1  # metric rows of lines 5, 6, 7, 11 and one restart flag
    ignored = dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall())
    assert ignored == {"blank line": 1, "tqdm progress bar": 2, "log or traceback line": 3,
                       "other console output": 1}
    [(line_no, reason)] = store.execute("SELECT line_no, reason FROM ingest_errors").fetchall()
    assert line_no == 9 and reason.startswith("Global step payload is not a Python dict literal")

    step1 = _metrics(store, 1)
    assert step1["policy_loss"] == 0.0123 and step1["actor_lr"] == 1e-06
    assert step1["rollout/num_samples"] == 256.0 and step1["timing/make_experience"] == 40.0
    step2 = _metrics(store, 2)
    assert math.isnan(step2["policy_loss"]) and step2["reward"] == 0.5 and step2["kl"] == -math.inf
    assert step2["eval/math500_pass1"] == 0.625 and step2["eval/aime_pass1"] == 0.1
    assert step2["eval/duration_s"] == 62.0
    assert _metrics(store, 1, segment=1) == {"policy_loss": 0.03, "reward": 0.2, "timing/step_total": 70.0}

    framework, fmt_version = store.execute(
        "SELECT r.framework, f.format_version FROM runs r JOIN files f USING (run_id)").fetchall()[0]
    assert (framework, fmt_version) == ("openrlhf", "0.9")


def test_canonical_stages_do_not_count_generation_twice(store):
    ingest_paths(store, [FIXTURES / "train_global_step.log"])
    rows = store.execute(
        "SELECT segment, step, gen_s, update_actor_s, step_s, response_length_mean, clip_ratio, flags"
        " FROM steps ORDER BY segment, step"
    ).fetchall()
    assert rows == [
        (0, 1, 30.0, 20.0, 63.0, 512.5, 0.125, []),
        (0, 2, 31.5, None, 65.25, None, None, []),
        (1, 1, None, None, 70.0, None, None, ["restart"]),
    ]


def test_tqdm_postfix_fallback_maps_short_keys(store):
    path = FIXTURES / "train_tqdm_only.log"
    [report] = ingest_paths(store, [path])
    assert report.format == "openrlhf-console"
    assert (report.lines, report.stored, report.ignored, report.rejected) == (5, 2, 3, 0)
    assert _metrics(store, 1) == {"policy_loss": 0.2, "reward": 0.4, "return": 0.5, "response_length": 120.0,
                                  "total_length": 170.0, "kl": 0.02, "actor_lr": 1e-06}
    assert _metrics(store, 2)["policy_loss"] == 0.3 and _metrics(store, 2)["total_length"] == 190.0
    flags = store.execute("SELECT step, flag FROM step_flags ORDER BY step").fetchall()
    assert flags == [(1, "tqdm_estimate"), (2, "tqdm_estimate")]
    ignored = dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall())
    assert ignored == {"tqdm progress bar": 2, "other console output": 1}


def test_log_with_no_metrics_is_zero_steps_not_an_error(store, tmp_path):
    path = tmp_path / "crashed" / "train.log"
    path.parent.mkdir()
    path.write_text("openrlhf starting\n"
                    "Train epoch [1/1]:  50%|#    | 1/2 [00:05<00:05, act_loss=0.9, reward=0.9]\n"
                    "torch.OutOfMemoryError: CUDA out of memory\n")
    [report] = ingest_paths(store, [path])
    assert report.format == "openrlhf-console"
    assert report.status == "ingested" and (report.lines, report.stored, report.ignored) == (3, 0, 3)
    assert any("zero steps" in note for note in report.notes)


def test_cli_ingest_prints_counts(tmp_path):
    result = CliRunner().invoke(app, ["ingest", str(FIXTURES / "train_global_step.log"),
                                      "--db", str(tmp_path / "s.duckdb"), "--json"])
    assert result.exit_code == 0, result.output
    assert '"rejected": 1' in result.output and '"format": "openrlhf-console"' in result.output


def test_requirements_file_naming_openrlhf_is_not_a_console_log(store, tmp_path):
    path = tmp_path / "files" / "requirements.txt"
    path.parent.mkdir()
    path.write_text("openrlhf==0.9.1\ntorch==2.6.0\n")
    [report] = ingest_paths(store, [tmp_path])
    assert report.status == "skipped"


def test_make_experience_is_named_but_not_a_stage_column(store):
    from polytrace_cli.ingest.formats.openrlhf import names as openrlhf_names

    ingest_paths(store, [FIXTURES / "train_global_step.log"])
    # OpenRLHF's own `timing/*` names (other frameworks name `timing/*` keys of their own).
    own = {key: canonical for key, canonical in openrlhf_names.METRIC_ALIASES.items() if key.startswith("timing/")}
    assert own == {"timing/broadcast": "weight_sync_s", "timing/generation": "gen_s",
                   "timing/make_experience": "make_experience_s", "timing/ppo_train": "update_actor_s",
                   "timing/step_total": "step_s"}
    stored = dict(store.execute("SELECT key, canonical FROM metric_aliases WHERE format = 'openrlhf-console'"
                                " AND list_contains(?, key)",
                                [list(own)]).fetchall())
    assert stored == own


def test_payloads_that_only_literal_eval_reads(store, tmp_path):
    path = tmp_path / "orl" / "train.log"
    path.parent.mkdir()
    path.write_text(
        "✨ Global step 4: {'note': \"it's\", 'flag': True, 'missing': None, 'pair': (1, 2), 'lr': np.float32(2e-06)}\n"
        "✨ Global step 5: {'nested': {'a': 1.5}, 'x': inf, 'y': -inf}\n"
        "✨ Global step 6: {'a': 1, 'b': [1, 2\n"
    )
    [report] = ingest_paths(store, [path])
    assert (report.lines, report.stored, report.rejected) == (3, 2, 1)
    assert _metrics(store, 4) == {"note": "it's", "flag": 1.0, "missing": None, "pair": "[1, 2]", "lr": 2e-06}
    assert _metrics(store, 5) == {"nested/a": 1.5, "x": math.inf, "y": -math.inf}
    assert store.execute("SELECT line_no, reason FROM ingest_errors").fetchall() == [
        (3, "Global step payload is not a Python dict literal: SyntaxError")]


def test_a_job_resumed_from_a_checkpoint_starts_a_segment(store, tmp_path):
    path = tmp_path / "orl" / "train.log"
    path.parent.mkdir()
    path.write_text(
        "✨ Global step 1: {'policy_loss': 0.5}\n"
        "✨ Global step 2: {'policy_loss': 0.4}\n"
        "Loaded the checkpoint: ckpt/_actor, consumed_samples: 256\n"
        "Loaded the checkpoint: ckpt/_critic\n"
        "✨ Global step 3: {'policy_loss': 0.3}\n"
    )
    [report] = ingest_paths(store, [path])
    assert (report.lines, report.stored, report.ignored, report.rejected) == (5, 3, 2, 0)
    assert store.execute("SELECT rule, lines FROM ignored_lines").fetchall() == [("checkpoint-load", 2)]
    assert store.execute("SELECT segment, step FROM step_metrics ORDER BY line_no").fetchall() == [
        (0, 1), (0, 2), (1, 3)]
    assert store.execute("SELECT segment, step, detail FROM step_flags WHERE flag = 'restart'").fetchall() == [
        (1, 3, "resumed from a checkpoint after step 2")]


def test_run_meta_from_the_command_line_and_content(store, tmp_path):
    path = tmp_path / "orl" / "train.log"
    path.parent.mkdir()
    path.write_text(
        "+ ray job submit -- python3 -m openrlhf.cli.train_ppo_ray --pretrain Qwen/Qwen2.5-7B"
        " --actor_num_nodes 2 --actor_num_gpus_per_node 4 --vllm_num_engines 2 --n_samples_per_prompt=8"
        " --generate_max_len 2048 --prompt_max_len 1024 --advantage_estimator group_norm\n"
        "(PPOTrainer pid=1) INFO 05-18 12:34:56 ppo_trainer.py:532] ✨ Global step 1: {'policy_loss': 0.5}\n"
    )
    [report] = ingest_paths(store, [path])
    assert (report.lines, report.stored, report.ignored, report.rejected) == (2, 1, 1, 0)
    meta = json.loads(store.execute("SELECT meta FROM runs").fetchall()[0][0])
    assert {k: meta[k] for k in ("framework", "openrlhf_version", "model", "nnodes", "n_gpus_per_node", "n_gpus",
                                 "n_sampling", "max_response_len", "max_prompt_len", "adv_estimator",
                                 "vllm_num_engines")} == {
        "framework": "openrlhf", "openrlhf_version": "0.8", "model": "Qwen/Qwen2.5-7B", "nnodes": 2,
        "n_gpus_per_node": 4, "n_gpus": 8, "n_sampling": 8, "max_response_len": 2048, "max_prompt_len": 1024,
        "adv_estimator": "group_norm", "vllm_num_engines": 2}


def test_version_class_from_content(store):
    # timing/* keys in Global step dicts: 0.9+; only tqdm postfixes: before 0.8.
    ingest_paths(store, [FIXTURES / "train_global_step.log"], run_name="a")
    ingest_paths(store, [FIXTURES / "train_tqdm_only.log"], run_name="b")
    metas = [json.loads(m) for (m,) in store.execute("SELECT meta FROM runs ORDER BY name").fetchall()]
    assert [m.get("openrlhf_version") for m in metas] == [">=0.9", "<0.8"]
