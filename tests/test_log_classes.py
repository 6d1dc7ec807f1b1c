"""Classes of real logs, each generated here small with a known truth: TRL dicts clumped by
buffering, with no training arguments printed; a verl record glued after a progress bar; holes in
the step numbers; a number glued to other text; crash noise that is not a crash; a writer's run
folder as it lands on disk; a TensorBoard run without `step_time`.

TRL facts used (from the libraries' own source):
- the Trainer logs when global_step % logging_steps == 0, and a `logging_steps` below 1 is a ratio
  of the total steps, rounded up (huggingface/transformers@55093b758b338fdc7903e778509523d755ae080d
  src/transformers/trainer_callback.py DefaultFlowCallback.on_step_end, src/transformers/trainer.py
  `_inner_training_loop`);
- GRPOTrainer appends one `step_time` per optimizer step and `log` prints the mean of each list over
  the logging interval (huggingface/trl@f2cd57710ae345ea6428ae95363267fcf38a3dc8
  trl/trainer/grpo_trainer.py `training_step`, `log`);
- the progress bar is stderr, the dicts stdout (ProgressCallback.on_log writes the dict with
  tqdm.write), so a file holding both gets them in the order the two buffers were flushed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from polytrace_cli.cli import app
from polytrace_cli.ingest.crashes import crash_start, first_crash
from polytrace_cli.diagnose.per_step import steps_with_causes
from polytrace_cli.ingest.driver import ingest_paths
from polytrace_cli.simulate.policies import whatif_run
from polytrace_cli.store import open_store
from polytrace_cli.store.queries import runs_frame
from polytrace_cli.watch import WatchSettings, watch_log
from polytrace_cli.watch.follow import STARTUP_CRASH_QUIET_POLLS, crash_in


def bar(count: int, total: int, elapsed: int) -> str:
    return f"{100 * count // total:3d}%|█         | {count}/{total} [{elapsed // 60:02d}:{elapsed % 60:02d}<00:10,  4.00s/it]"


def trl_dict(k: int, interval: int) -> dict:
    """The k-th logged dict: step k·interval, values that say which dict it is."""
    return {"loss": 0.001 * k, "num_tokens": 1000.0 * k * interval, "completions/mean_length": 100.0 + k,
            "completions/max_length": 200.0 + k, "completion_length": 200.0 + k, "reward": 0.5, "kl": 0.01,
            "step_time": 4.0 + 0.125 * k, "epoch": round(k * interval / 60, 2)}


def clumped_trl_log(steps: int = 60, interval: int = 5, clump: int = 4) -> str:
    """A GRPO log where stdout (the dicts) is flushed every `clump` dicts and stderr (the bar) as it
    draws: each clump lands after the bar has drawn further than its dicts' steps."""
    lines = ["🦥 Unsloth: Will patch your computer to enable 2x faster free finetuning.", "GRPOTrainer starts",
             "  Total train batch size (w. parallel, distributed & accumulation) = 16"]
    pending: list[str] = []
    text = "\r" + bar(0, steps, 0)
    for step in range(1, steps + 1):
        text += "\r" + bar(step, steps, 4 * step)
        if step % interval == 0:
            pending.append(repr(trl_dict(step // interval, interval)))
        if len(pending) == clump or step == steps:
            lines.append(text + "\r" + " " * 40 + "\r" + pending[0])
            lines += pending[1:]
            pending, text = [], ""
    lines.append(text + "\r" + "{'train_runtime': 240.5, 'train_samples_per_second': 1.0, "
                 "'train_steps_per_second': 0.25, 'train_loss': 0.01, 'epoch': 1.0}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    connection = open_store(tmp_path_factory.mktemp("classes") / "classes.duckdb")
    yield connection
    connection.close()


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def steps_of(con, run: str, key: str | None = None) -> dict[int, float] | list[int]:
    if key is None:
        return [s for (s,) in con.execute("SELECT DISTINCT step FROM step_metrics JOIN runs USING (run_id) "
                                          "WHERE name = ? ORDER BY step", [run]).fetchall()]
    return dict(con.execute("SELECT step, value FROM step_metrics JOIN runs USING (run_id) WHERE name = ? AND key = ?",
                            [run, key]).fetchall())


def test_clumped_trl_dicts_without_training_arguments_are_numbered_by_the_interval(con, tmp_path):
    """12 dicts of a 60-step bar, flushed 4 at a time after the bar ran ahead: logging_steps is
    ⌊60 / 12⌋ = 5, dict k is step 5k (one segment), each row stands for 5 steps; the mean length is
    TRL's `completions/mean_length`, Unsloth's `completion_length` kept apart."""
    log = write(tmp_path / "clumped", "train.log", clumped_trl_log())
    [report] = ingest_paths(con, [log], run_name="clumped")
    assert report.format == "trl-console" and report.rejected == 0
    assert steps_of(con, "clumped") == list(range(5, 61, 5))
    assert con.execute("SELECT count(DISTINCT segment) FROM step_metrics JOIN runs USING (run_id) "
                       "WHERE name = 'clumped'").fetchall() == [(1,)]
    assert steps_of(con, "clumped", "loss") == {5 * k: 0.001 * k for k in range(1, 13)}
    assert set(steps_of(con, "clumped", "trl/steps_covered").values()) == {5.0}
    means = dict(con.execute("SELECT step, response_length_mean FROM steps JOIN runs USING (run_id) "
                             "WHERE name = 'clumped'").fetchall())
    assert means == {5 * k: 100.0 + k for k in range(1, 13)}
    assert steps_of(con, "clumped", "unsloth/completion_length") == {5 * k: 200.0 + k for k in range(1, 13)}
    assert "TRL dicts numbered k × logging_steps: logging_steps=5 inferred from the progress bar's last count " \
           "over 12 dict(s)" in report.notes
    meta = json.loads(con.execute("SELECT meta FROM runs WHERE name = 'clumped'").fetchall()[0][0])
    assert (meta["trl_logging_steps"], meta["trl_logging_steps_source"]) == (5, "bar count")


def test_a_run_of_logged_rows_adds_up_to_its_steps_seconds(con, tmp_path):
    """whatif's logged wall time is Σ step_time × 5 over the 12 rows: each row is the mean of 5
    steps (4.0 + 0.125 k per step for dict k)."""
    log = write(tmp_path / "seconds", "train.log", clumped_trl_log())
    ingest_paths(con, [log], run_name="seconds")
    result = whatif_run(con, "seconds", ["balance"])
    assert result.actual_s == pytest.approx(sum(5 * (4.0 + 0.125 * k) for k in range(1, 13)))
    # The Trainer's printed total train batch size is the step's completions: the length policies run.
    assert con.execute("SELECT responses_per_step FROM run_semantics JOIN runs USING (run_id) WHERE name = 'seconds'"
                       ).fetchall() == [(16.0,)]
    (capped,) = whatif_run(con, "seconds", ["max-response-len=150"]).scenarios
    assert capped.predicted_s is not None and capped.saving_s >= 0


def test_trl_logging_steps_printed_as_a_ratio_and_a_resumed_bar(con, tmp_path):
    """`logging_steps=0.1` of a 40-step run is every ⌈4.0⌉ = 4 steps; a resumed run's bar is drawn at
    0, then jumps to the step after its checkpoint (21): its dicts are 24, 28, ..."""
    dicts = [repr(trl_dict(k, 4)) for k in range(1, 11)]
    text = "GRPOConfig(output_dir='o', logging_steps=0.1, max_steps=40)\n" + "".join(
        "\r" + bar(4 * k, 40, 16 * k) + "\r" + line + "\n" for k, line in enumerate(dicts, start=1))
    [report] = ingest_paths(con, [write(tmp_path / "ratio", "train.log", text)], run_name="ratio")
    assert steps_of(con, "ratio") == list(range(4, 41, 4)) and report.rejected == 0
    resumed = "\r" + bar(0, 40, 0) + "\r" + bar(21, 40, 4) + "\n" + "".join(
        "\r" + bar(20 + 4 * k, 40, 16 * k) + "\r" + repr(trl_dict(k, 4)) + "\n" for k in range(1, 6))
    ingest_paths(con, [write(tmp_path / "resumed", "train.log", resumed)], run_name="resumed")
    assert steps_of(con, "resumed") == [24, 28, 32, 36, 40]
    flags = con.execute("SELECT DISTINCT flag FROM step_flags JOIN runs USING (run_id) WHERE name = 'resumed'").fetchall()
    assert ("resumed",) in flags


def test_a_verl_record_behind_a_carriage_return_is_read_and_an_unread_one_fails_strict(con, tmp_path):
    """tqdm draws `\\rEpoch …| 1/10 […]` on stderr with no line end, then verl prints the step's record:
    the record follows the bar in the same piece. A record text that stays unread (here behind a log
    prefix no format strips) is counted apart, and `--strict` fails on it."""
    records = [f"step:{s} - actor/loss:0.{s} - timing_s/gen:1{s}.0 - timing_s/step:2{s}.0" for s in range(1, 6)]
    lines = [f"\rEpoch 1/20: {10 * s}%|█| {s}/10 [00:{11 * s:02d}<01:43, 11.45s/it]" + record
             for s, record in enumerate(records, start=1)]
    lines[3] = "INFO 12-01 10:00:00 trainer.py:12] " + records[3]
    lines[4] = lines[4].replace("step:5", "(TaskRunner pid=7, ip=10.0.0.1) step:5")  # from a Ray actor's stdout
    log = write(tmp_path / "glued_bar", "train.log", "\n".join(lines) + "\n")
    [report] = ingest_paths(con, [log], run_name="glued_bar")
    assert steps_of(con, "glued_bar") == [1, 2, 3, 5]
    assert report.unread_records == 1
    runs = {row["run"]: row for row in runs_frame(con).iter_rows(named=True)}
    assert runs["glued_bar"]["missing_steps"] == 1
    steps = steps_with_causes(con, [runs_ids(con, "glued_bar")])
    assert dict(steps.select("step", "missing_before").iter_rows()) == {1: None, 2: 0, 3: 0, 5: 1}
    strict = CliRunner().invoke(app, ["ingest", str(log), "--db", str(tmp_path / "strict.duckdb"), "--strict"])
    assert strict.exit_code == 1 and "1 line(s) look like metric records but were not read" in strict.output
    # A log written every 5 steps has no hole.
    ingest_paths(con, [write(tmp_path / "every5", "train.log", clumped_trl_log())], run_name="every5")
    assert {row["run"]: row for row in runs_frame(con).iter_rows(named=True)}["every5"]["missing_steps"] == 0


def runs_ids(con, name: str) -> int:
    return con.execute("SELECT run_id FROM runs WHERE name = ?", [name]).fetchall()[0][0]


def test_a_number_glued_to_other_text(con, tmp_path):
    text = ("step:1 - actor/loss:0.5 - val/loss:0.0712/home/u/torch/distributed_c10d.py:4807: UserWarning: x\n"
            "step:2 - actor/loss:0.4 - val/loss:0.07abc1\n"
            "step:3 - actor/loss:0.3 - val/loss:0.06\n")
    [report] = ingest_paths(con, [write(tmp_path / "glued", "train.log", text)], run_name="glued")
    assert steps_of(con, "glued", "val/loss") == {1: 0.0712, 3: 0.06}
    assert con.execute("SELECT count(*) FROM step_metrics JOIN runs USING (run_id) WHERE name = 'glued' "
                       "AND text_value IS NOT NULL").fetchall() == [(0,)]
    [(line, reason)] = con.execute("SELECT line_no, reason FROM ingest_errors JOIN files USING (file_id) "
                                   "WHERE path = ?", [report.path]).fetchall()
    assert line == 2 and reason == "key val/loss: value '0.07abc1' is a number run into other text"
    assert any(note.startswith("1 value(s) glued to text that is not part of them") for note in report.notes)


RAY_GET = ["Traceback (most recent call last):", '  File "main_ppo.py", line 40, in main',
           "    ray.get(runner.run.remote(config))",
           "ray.exceptions.RayTaskError(ChunkedEncodingError): ray::TaskRunner.run() (pid=9, ip=10.0.0.1)",
           '  File "reward.py", line 12, in score',
           "requests.exceptions.ChunkedEncodingError: ('Connection broken: IncompleteRead(0 bytes read)')"]
SHUTDOWN = ["Exception ignored in: <function ResourceTracker.__del__ at 0x7f>", "Traceback (most recent call last):",
            '  File "/usr/lib/python3.10/multiprocessing/resource_tracker.py", line 77, in __del__',
            "AttributeError: 'NoneType' object has no attribute 'close'"]


def test_crashes_are_fatal_errors_and_noise_is_not():
    # Python's shutdown block after the real error: the Ray task's own error is the crash.
    crash = first_crash(RAY_GET + SHUTDOWN)
    assert (crash.cause, crash.reason) == ("traceback", "requests.exceptions.ChunkedEncodingError: "
                                                        "('Connection broken: IncompleteRead(0 bytes read)')")
    assert first_crash(["step:9 - a:1", *SHUTDOWN]) is None
    # A retried HTTP 502, a warning, a config dump in colour, a traceback a handler logged, a worker stopped.
    noise = ["WARNING:urllib3.connectionpool:Retrying (Retry(total=4)) after connection broken by "
             "'ProxyError('502 Bad Gateway')': /v1/chat", "UserWarning: NCCL timeout is long",
             "\x1b[36m(TaskRunner pid=7)\x1b[0m  'nccl_timeout': 600,", "nccl_timeout: 600",
             "trainer.nccl_timeout=600", "ERROR:2026-03-26 22:35:46,212:Traceback (most recent call last):",
             '  File "env.py", line 3, in step', "TypeError: cannot unpack non-iterable NoneType object",
             "(WorkerDict pid=8) *** SIGTERM received at time=1767607200 on cpu 0 ***"]
    assert first_crash(noise) is None and crash_start(noise) is None
    assert first_crash(["\x1b[31mtorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\x1b[0m"]) \
        .reason == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert first_crash(["[E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout: "
                        "WorkNCCL(SeqNum=1) ran for 600000 milliseconds"]).cause == "nccl_timeout"
    assert first_crash(["*** SIGTERM received at time=1767607200 on cpu 0 (pid 27182) ***"]).cause == "signal"
    assert crash_in("\n".join(RAY_GET + SHUTDOWN))[0] == "traceback"


def test_a_verl_log_ending_on_shutdown_noise_did_not_crash(con, tmp_path):
    text = "\n".join(["step:1 - actor/loss:0.5 - timing_s/step:20.0", "step:2 - actor/loss:0.4 - timing_s/step:21.0",
                      "WARNING: Retrying request after HTTP 502", *SHUTDOWN]) + "\n"
    ingest_paths(con, [write(tmp_path / "finished", "train.log", text)], run_name="finished")
    assert con.execute("SELECT crash FROM run_semantics JOIN runs USING (run_id) WHERE name = 'finished'"
                       ).fetchall() == [(None,)]
    text = "\n".join(["step:1 - actor/loss:0.5 - timing_s/step:20.0", *RAY_GET, *SHUTDOWN]) + "\n"
    ingest_paths(con, [write(tmp_path / "died", "train.log", text)], run_name="died")
    assert con.execute("SELECT crash FROM run_semantics JOIN runs USING (run_id) WHERE name = 'died'").fetchall() == [
        ("requests.exceptions.ChunkedEncodingError: ('Connection broken: IncompleteRead(0 bytes read)')",)]


def test_refusals_for_lack_of_steps_name_the_crash(tmp_path):
    folder = tmp_path / "oom"
    write(folder, "train.log", "(TaskRunner pid=3) {'actor_rollout_ref': {'nccl_timeout': 600}}\n"
          "Traceback (most recent call last):\n  File \"main_ppo.py\", line 9\n"
          "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    db = str(tmp_path / "s.duckdb")
    assert CliRunner().invoke(app, ["ingest", str(folder), "--db", db, "--format", "verl-console"]).exit_code == 0
    died = "the job died before its first step: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    for command in (["explain", "oom"], ["check", "oom", "--max-imbalance", "1.2"], ["whatif", "oom", "--backtest"]):
        result = CliRunner().invoke(app, [*command, "--db", db])
        assert result.exit_code != 0 and died in " ".join(result.output.split()), result.output


class ScriptedJob:
    """A job writing its log on the watcher's own clock (see tests/test_watch.py)."""

    def __init__(self, log: Path, script: dict[int, str]):
        self.log, self.script, self.polls, self.now = log, script, 0, 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        import os

        self.now += seconds
        self.polls += 1
        if self.polls in self.script:
            with open(self.log, "a", encoding="utf-8") as handle:
                handle.write(self.script[self.polls])
            stat = self.log.stat()
            os.utime(self.log, ns=(stat.st_atime_ns, stat.st_mtime_ns + self.polls * 1_000_000_000))


def test_watch_never_alerts_on_a_config_dump_and_waits_out_a_pause_before_the_first_step(tmp_path):
    """A config dump naming nccl_timeout in colour, then 20 polls of silence (loading), then steps:
    no crash alert. A real traceback before the first step ends watching only after the start-up
    grace (STARTUP_CRASH_QUIET_POLLS polls without growth)."""
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    log.write_text("")
    config = "\x1b[36m(TaskRunner pid=7)\x1b[0m {'actor_rollout_ref': {'nccl_timeout': 600,\n" \
             "\x1b[36m(TaskRunner pid=7)\x1b[0m                        'rollout': {'n': 4}}}\n"
    steps = "".join(f"(TaskRunner pid=7) step:{s} - actor/loss:0.5 - timing_s/step:20.0\n" for s in range(1, 4))
    job = ScriptedJob(log, {1: config, 21: steps})
    events: list[dict] = []
    con = open_store(tmp_path / "w.duckdb")
    result = watch_log(con, log, events.append, WatchSettings(poll=1.0, idle_exit=60), clock=job.clock, sleep=job.sleep)
    con.close()
    assert result.exit_code == 0 and [e for e in events if e.get("kind") == "crash"] == []
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3]

    log2 = tmp_path / "job2" / "train.log"
    log2.parent.mkdir()
    log2.write_text("")
    job2 = ScriptedJob(log2, {1: "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad\n"})
    events2: list[dict] = []
    con2 = open_store(tmp_path / "w2.duckdb")
    result2 = watch_log(con2, log2, events2.append, WatchSettings(poll=1.0, idle_exit=100), clock=job2.clock,
                        sleep=job2.sleep)
    con2.close()
    assert result2.exit_code == 3 and job2.polls == 1 + STARTUP_CRASH_QUIET_POLLS
    assert [e["reason"] for e in events2 if e.get("kind") == "crash"] == ["ValueError: bad"]


def test_a_wandb_run_folder_as_wandb_leaves_it(tmp_path):
    """The console capture is read; wandb's own debug logs and run files are ignored under named
    rules (listed by --verbose), and the ingest exits 0. A hidden file named as a log is read, a
    hidden file that is not a log is passed over."""
    run = tmp_path / "wandb" / "run-20251129_221801-i80f2v90"
    write(run / "files", "output.log", "step:1 - actor/loss:0.5 - timing_s/step:20.0\n"
          "step:2 - actor/loss:0.4 - timing_s/step:21.0\n")
    write(run / "files", "wandb-metadata.json", '{"os": "Linux", "python": "3.10"}\n')
    write(run / "files", "requirements.txt", "torch==2.4.0\n")
    for name in ("debug.log", "debug-internal.log", "debug-core.log"):
        write(run / "logs", name, "2025-11-29 22:18:01,231 INFO    MainThread:1 [wandb_setup.py:_flush():67] setup\n")
    write(tmp_path / "wandb", "debug.log", "2025-11-29 22:18:01,231 INFO    MainThread:1 [wandb_init.py:1] init\n")
    write(tmp_path / "wandb", "core-debug-20251129_221801.log", '{"time":"2025-11-29T22:18:01","level":"INFO"}\n')
    write(tmp_path / "wandb", ".DS_Store", "\x00\x01binary")
    write(tmp_path / "wandb", ".job.log", "step:1 - critic/loss:0.5\n")
    db = str(tmp_path / "s.duckdb")
    result = CliRunner().invoke(app, ["ingest", str(tmp_path / "wandb"), "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    reports = {Path(r["path"]).name: r for r in json.loads(result.output)}
    assert reports["output.log"]["status"] == "ingested" and reports[".job.log"]["status"] == "ingested"
    assert ".DS_Store" not in reports
    assert {name: r["side_rule"] for name, r in reports.items() if r["side_rule"]} == {
        "debug.log": "wandb debug log", "debug-internal.log": "wandb debug log", "debug-core.log": "wandb debug log",
        "core-debug-20251129_221801.log": "wandb debug log", "wandb-metadata.json": "wandb run file",
        "requirements.txt": "wandb run file"}
    quiet = CliRunner().invoke(app, ["ingest", str(tmp_path / "wandb"), "--db", str(tmp_path / "q.duckdb")])
    assert quiet.exit_code == 0 and "ignored 7 side file(s) of the writers: wandb debug log: 5, wandb run file: 2" \
        in quiet.output
    verbose = CliRunner().invoke(app, ["ingest", str(tmp_path / "wandb"), "--db", str(tmp_path / "v.duckdb"), "-v"])
    assert verbose.exit_code == 0 and verbose.output.count("ignored: wandb debug log") == 5


def test_a_trl_tensorboard_run_without_step_time_takes_it_from_the_wall_time(con, tmp_path):
    """The Trainer's TensorBoard callback writes `train/<key>` per logged step; without `step_time`
    the events' wall time between logged steps, over the steps between, is the step time."""
    tensorboardX = pytest.importorskip("tensorboardX")
    writer = tensorboardX.SummaryWriter(logdir=str(tmp_path / "tb"))
    walls = {2: 1000.0, 4: 1010.0, 6: 1030.0}
    for step, wall in walls.items():
        for key, value in (("completions/mean_length", 300.0), ("loss", 0.01), ("epoch", step / 10)):
            writer.add_scalar(f"train/{key}", value, step, walltime=wall)
    writer.close()
    [events] = (tmp_path / "tb").glob("events.out.tfevents.*")
    ingest_paths(con, [events], run_name="tb")
    rows = dict(con.execute("SELECT step, step_s FROM steps JOIN runs USING (run_id) WHERE name = 'tb'").fetchall())
    assert rows == {2: None, 4: 5.0, 6: 10.0}
    assert set(steps_of(con, "tb", "trl/steps_covered").values()) == {2.0}


def test_a_run_that_validates_every_step_is_explained_in_seconds(tmp_path):
    """Every step logs `timing_s/testing` (about 300 s of a 335 s step) beside its `timing_s/step`:
    the steps are still training steps, the validation an overhead the model keeps apart; explain
    names it as 90% of the run and whatif's no-validation policy saves it."""
    lines = [f"step:{s} - timing_s/gen:{20 + s % 5}.0 - timing_s/update_actor:{10 + s % 3}.0 - timing_s/testing:300.0"
             f" - timing_s/step:{331 + s % 5 + s % 3}.0 - response_length/mean:{500 + 7 * s % 90}.0"
             f" - response_length/max:{1000 + 37 * s % 400}.0 - val-core/acc:0.5" for s in range(1, 31)]
    folder = tmp_path / "everyval"
    write(folder, "train.log", "\n".join(lines) + "\n")
    db = str(tmp_path / "s.duckdb")
    assert CliRunner().invoke(app, ["ingest", str(folder), "--db", db]).exit_code == 0
    explained = json.loads(CliRunner().invoke(app, ["explain", "everyval", "--db", db, "--json"]).output)
    assert explained["basis"] == "seconds"
    (validation,) = [f for f in explained["findings"] if f["cause"] == "validation"]
    assert validation["seconds"] == 30 * 300.0 and validation["text"].startswith("validation every step took")
    whatif = json.loads(CliRunner().invoke(app, ["whatif", "everyval", "--db", db, "--policy", "no-validation",
                                                 "--json"]).output)
    (scenario,) = whatif["scenarios"]
    assert scenario["saving_s"] == pytest.approx(30 * 300.0)


def test_f11_left_out_for_two_steps_says_why(con, tmp_path):
    """A run of 2 steps logs step time and max response length: F11 is left out for having fewer
    than 3 steps, not because the run logs neither."""
    from polytrace_cli.analyze.common import ALL_STEPS
    from polytrace_cli.report.figures import f11_step_vs_max_length as f11

    text = "".join(f"step:{s} - timing_s/gen:1{s}.0 - timing_s/step:2{s}.0 - response_length/max:{900 + s}.0\n"
                   for s in (1, 2))
    ingest_paths(con, [write(tmp_path / "two", "train.log", text)], run_name="two")
    omitted = f11.render(f11.frames(con, [runs_ids(con, "two")], ALL_STEPS))
    assert "3 or more training steps with both a step time and a max response length" in omitted.reason


def test_a_trainer_output_folder_and_an_mlflow_store_as_they_land(tmp_path):
    """A checkpoint folder's weights, optimizer state and configs, an MLflow run's artifacts and a
    TensorBoard profile are ignored under their rules; the records beside them are read."""
    out = tmp_path / "grpo_out"
    state = {"global_step": 4, "logging_steps": 2, "log_history": [
        {"loss": 0.1, "completions/mean_length": 300.0, "epoch": 0.5, "step": 2},
        {"loss": 0.2, "completions/mean_length": 310.0, "epoch": 1.0, "step": 4}]}
    write(out / "checkpoint-4", "trainer_state.json", json.dumps(state))
    (out / "checkpoint-4" / "optimizer.pt").write_bytes(b"PK\x03\x04" + bytes(range(256)))
    write(out / "checkpoint-4", "config.json", '{"architectures": ["Qwen2ForCausalLM"]}')
    write(out / "checkpoint-4", "tokenizer_config.json", '{"model_max_length": 32768}')
    run = tmp_path / "mlruns" / "0" / "0123abcd"
    write(run, "meta.yaml", "artifact_uri: file:///mlruns/0/0123abcd/artifacts\nexperiment_id: '0'\n"
          "run_id: 0123abcd\nrun_name: grpo\nstatus: 3\nstart_time: 1700000000000\n")
    write(run / "metrics", "loss", "1700000000000 0.5 1\n1700000001000 0.4 2\n")
    write(run / "artifacts", "notes.log", "a free-form text the user saved\n")
    write(tmp_path / "tb" / "plugins" / "profile" / "2025_11_29", "host.trace.log", "profile text\n")
    result = CliRunner().invoke(app, ["ingest", str(tmp_path), "--db", str(tmp_path / "s.duckdb"), "--json"])
    assert result.exit_code == 0, result.output
    reports = {str(Path(r["path"]).relative_to(tmp_path)): r for r in json.loads(result.output)}
    assert reports["grpo_out/checkpoint-4/trainer_state.json"]["status"] == "ingested"
    assert reports["mlruns/0/0123abcd/metrics/loss"]["status"] == "ingested"
    assert {name: r["side_rule"] for name, r in reports.items() if r["side_rule"]} == {
        "grpo_out/checkpoint-4/optimizer.pt": "checkpoint file", "grpo_out/checkpoint-4/config.json": "checkpoint file",
        "grpo_out/checkpoint-4/tokenizer_config.json": "checkpoint file",
        "mlruns/0/0123abcd/artifacts/notes.log": "mlflow side file",
        "tb/plugins/profile/2025_11_29/host.trace.log": "tensorboard side file"}
