"""The frameworks' keys as their TensorBoard backends write them (real event files from tensorboardX at test
time): each names its run's framework and fills the canonical stages through the framework's names.

AReaL `areal/utils/stats_logger.py` (`summary_writer.add_scalar(key, val, step)` of its stats), SkyRL
`skyrl/train/utils/tracking.py` (`_TensorboardAdapter.log`: `add_scalar(key, value, step)` of the step's
payload), ROLL `roll/utils/tracking.py` (`TensorBoardTracker.log`: `add_scalar(key, value, step)`), at the
commits the console tests name.
"""

from __future__ import annotations

import pytest

from polytrace_cli.ingest.driver import ingest_paths

CASES = {
    "areal": ({"timeperf/rollout": 41.0, "timeperf/train_step": 20.0, "timeperf/update_weights": 3.5,
               "ppo_actor/prompt_len/avg": 200.0}, {"trainer_wait_s": 41.0, "update_actor_s": 20.0,
                                                     "update_weights_s": 3.5, "prompt_length_mean": 200.0}),
    "skyrl": ({"timing/step": 77.0, "timing/generate": 41.0, "timing/fwd_logprobs_values_reward": 9.0,
               "generate/avg_num_tokens": 612.0}, {"step_s": 77.0, "gen_s": 41.0, "old_log_prob_s": 9.0,
                                                   "response_length_mean": 612.0}),
    "roll": ({"time/step_generate": 44.0, "time/step_train": 21.0, "time/step_model_update": 3.5,
              "token/response_length/mean": 640.0}, {"gen_s": 44.0, "update_actor_s": 21.0, "update_weights_s": 3.5,
                                                     "response_length_mean": 640.0}),
}


@pytest.mark.parametrize("framework", sorted(CASES))
def test_tensorboard_events_name_the_framework_and_fill_its_stages(store, tmp_path, framework):
    tensorboardX = pytest.importorskip("tensorboardX")
    logged, canonical = CASES[framework]
    folder = tmp_path / framework / "tensorboard"
    writer = tensorboardX.SummaryWriter(logdir=str(folder))
    for key, value in logged.items():
        writer.add_scalar(key, value, 3)
    writer.close()
    [report] = ingest_paths(store, [folder], run_name=framework)
    assert report.format == "tensorboard-events"
    assert store.execute("SELECT framework FROM runs").fetchone() == (framework,)
    columns = ", ".join(canonical)
    assert store.execute(f"SELECT step, {columns} FROM steps").fetchone() == (3, *canonical.values())


def test_each_frameworks_log_is_claimed_by_its_own_format_alone():
    # Sniffing order then does not matter for them: no other format's sniff accepts these logs.
    from pathlib import Path

    from polytrace_cli.ingest.sniffing import all_ingesters, read_head

    fixtures = Path(__file__).parent / "fixtures"
    expected = {"slime/colocate.log": "slime-console", "slime/async.log": "slime-console",
                "nemo_rl/grpo_math.log": "nemo-rl-console", "skyrl/console.log": "skyrl-console",
                "roll/rlvr.log": "roll-console", "areal/console.log": "areal-console"}
    for name, fmt in expected.items():
        path = fixtures / name
        head = read_head(path)
        assert [i.name for i in all_ingesters() if i.sniff(path, head)] == [fmt], name
