"""SkyRL's console tracker: the step dicts loguru prints, pretty-printed over several lines.

The fixture is written from SkyRL's source at commit a9564572eb8e91076be43c1bd5e4615e3de17265
(NovaSky-AI/SkyRL): `skyrl/train/utils/tracking.py` (`ConsoleLogger.log`: `logger.info(f"Step {step}:
\\n{pprint.pformat(stringify_floats(data))}")`, floats as text with four decimals),
`skyrl/train/trainer.py` (the `Timer` blocks logged as `timing/<name>`) and
`skyrl/train/generators/utils.py` (`generate/{min,max,avg}_num_tokens`: response lengths) and
`skyrl/train/entrypoints/main_base.py` (the config logged as YAML at start; field names of
`skyrl/train/config/config.py`: `PlacementConfig.colocate_all`, `policy_num_nodes`,
`policy_num_gpus_per_node`, `n_samples_per_prompt`).
"""

from __future__ import annotations

import json
from pathlib import Path

from polytrace_cli.ingest.driver import ingest_paths

FIXTURES = Path(__file__).parent / "fixtures" / "skyrl"


def test_the_step_dicts_give_stages_and_lengths(store):
    [report] = ingest_paths(store, [FIXTURES / "console.log"], run_name="sky")
    assert report.format == "skyrl-console"
    # Step 1's dict spans 13 lines, step 2's 4; step 3's dict is cut off by the end of the file; the config
    # SkyRL logs at start is 8 lines.
    assert (report.lines, report.stored, report.ignored, report.rejected) == (32, 17, 12, 3)
    assert dict(store.execute("SELECT rule, lines FROM ignored_lines").fetchall()) == {
        "logging": 4, "ray-log": 7, "tqdm": 1}
    assert [row[0] for row in store.execute("SELECT line_no FROM ingest_errors ORDER BY 1").fetchall()] == [30, 31, 32]
    assert store.execute(
        "SELECT step, step_s, gen_s, old_log_prob_s, update_actor_s, update_weights_s, adv_s, response_length_mean,"
        " response_length_max FROM steps ORDER BY step").fetchall() == [
        (1, 77.031, 41.25, 9.25, 20.0, 3.5, 0.051, 612.5, 4096.0), (2, 79.5, 43.0, None, None, None, None, 640.0, None)]
    # Text that is a number printed by `stringify_floats` is the number; the run says its precision.
    assert store.execute("SELECT value FROM step_metrics WHERE key = 'policy/policy_loss'").fetchone() == (0.0123,)
    framework, meta = store.execute("SELECT framework, meta FROM runs").fetchone()
    assert framework == "skyrl" and json.loads(meta) == {
        "framework": "skyrl", "value_precision": 0.0001, "colocate": True, "policy_num_nodes": 1,
        "policy_num_gpus_per_node": 4, "n_gpus": 4, "n_sampling": 5,
        "console_clock": "printed times without a zone, read as UTC"}
    # SkyRL's records are logged with loguru's time (no zone): each step's clock is its dict's time.
    assert store.execute("SELECT step, source FROM step_clock ORDER BY step").fetchall() == [(1, "console"),
                                                                                         (2, "console")]


def test_a_restarted_job_is_a_new_segment(store, tmp_path):
    text = (FIXTURES / "console.log").read_text().rsplit("(skyrl_entrypoint pid=9123) 2025-08-21 18:05", 1)[0]
    log = tmp_path / "again.log"
    log.write_text(text + text)
    [report] = ingest_paths(store, [log], run_name="again")
    assert report.rejected == 0 and report.stored == 34
    assert store.execute("SELECT segment, step, flag, detail FROM step_flags").fetchall() == [
        (1, 1, "restart", "step went back from 2 to 1")]


def test_a_long_dict_printed_by_pprint_reads_whole(store, tmp_path):
    # The console tracker's own calls: `pprint.pformat` of the floats stringified with four decimals.
    import pprint

    payload = {f"timing/stage_{index:03d}": f"{index / 7:.4f}" for index in range(150)}
    payload["timing/step"] = "99.5000"
    header = "2025-08-21 18:02:38.123 | INFO     | skyrl.train.utils.tracking:log:189 - Step 4: "
    log = tmp_path / "long.log"
    log.write_text(header + "\n" + pprint.pformat(payload) + "\n" + "2025-08-21 18:02:39.000 | INFO | done\n")
    [report] = ingest_paths(store, [log], run_name="long")
    assert report.format == "skyrl-console" and report.rejected == 0
    assert report.stored == 1 + pprint.pformat(payload).count("\n") + 1 and report.stored > 100
    assert store.execute("SELECT count(*), max(step) FROM step_metrics").fetchone() == (151, 4)
    assert store.execute("SELECT step_s FROM steps").fetchone() == (99.5,)
